"""Boundary checks for `SpecEngine.generate`: every bad input fails before any model call."""

from __future__ import annotations

from collections.abc import Sequence

from ..config import SamplingParams


def validate_generate_args(prompts: Sequence[Sequence[int]], params: SamplingParams, n: int, vocab_size: int,
                           max_seq_len: int, max_new_tokens: Sequence[int] | None = None,
                           prompt_indices: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """Raise `ValueError` on the first bad argument; return each prompt's token budget and index."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params={params!r} is invalid: a SamplingParams is required")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r} is invalid: an int >= 1 (completions per prompt)")
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts={type(prompts).__name__} is invalid: a list of lists of token ids is required")
    bad_stop = [s for s in params.stop_token_ids if s >= vocab_size]
    if bad_stop:
        raise ValueError(f"stop_token_ids={bad_stop} is invalid: ids must be in [0, {vocab_size})")
    if max_new_tokens is None:
        budgets = [params.max_new_tokens] * len(prompts)
    else:
        budgets = list(max_new_tokens)
        if len(budgets) != len(prompts):
            raise ValueError(
                f"max_new_tokens has {len(budgets)} entries for {len(prompts)} prompts: one budget per prompt"
            )
        bad_budget = [b for b in budgets if not isinstance(b, int) or not 1 <= b <= params.max_new_tokens]
        if bad_budget:
            raise ValueError(
                f"max_new_tokens={bad_budget[:5]} is invalid: per-prompt budgets are ints in "
                f"[1, params.max_new_tokens={params.max_new_tokens}]"
            )
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise ValueError(f"prompts[{i}]={prompt!r} is invalid: a list of token ids is required")
        if len(prompt) == 0:
            raise ValueError(f"prompts[{i}] is empty: a prompt needs at least one token")
        bad = [t for t in prompt if not isinstance(t, int) or t < 0 or t >= vocab_size]
        if bad:
            raise ValueError(f"prompts[{i}] has token ids {bad[:5]}: ids must be ints in [0, {vocab_size})")
        if len(prompt) + budgets[i] > max_seq_len:
            raise ValueError(
                f"prompts[{i}] has {len(prompt)} tokens and max_new_tokens={budgets[i]}: "
                f"together {len(prompt) + budgets[i]} > max_seq_len={max_seq_len}"
            )
    if prompt_indices is None:
        return budgets, list(range(len(prompts)))
    indices = list(prompt_indices)
    if len(indices) != len(prompts):
        raise ValueError(f"prompt_indices has {len(indices)} entries for {len(prompts)} prompts: one index per prompt")
    bad_index = [i for i in indices if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < 2**62]
    if bad_index:
        raise ValueError(f"prompt_indices={bad_index[:5]} is invalid: ints in [0, 2**62)")
    return budgets, indices
