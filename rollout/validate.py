"""Boundary checks for `SpecEngine.generate`: every bad input fails before any model call."""

from __future__ import annotations

from collections.abc import Sequence

from .config import SamplingParams


def validate_generate_args(prompts: Sequence[Sequence[int]], params: SamplingParams, n: int, vocab_size: int,
                           max_seq_len: int) -> None:
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params={params!r} is invalid: a SamplingParams is required")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r} is invalid: an int >= 1 (completions per prompt)")
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts={type(prompts).__name__} is invalid: a list of lists of token ids is required")
    bad_stop = [s for s in params.stop_token_ids if s >= vocab_size]
    if bad_stop:
        raise ValueError(f"stop_token_ids={bad_stop} is invalid: ids must be in [0, {vocab_size})")
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise ValueError(f"prompts[{i}]={prompt!r} is invalid: a list of token ids is required")
        if len(prompt) == 0:
            raise ValueError(f"prompts[{i}] is empty: a prompt needs at least one token")
        bad = [t for t in prompt if not isinstance(t, int) or t < 0 or t >= vocab_size]
        if bad:
            raise ValueError(f"prompts[{i}] has token ids {bad[:5]}: ids must be ints in [0, {vocab_size})")
        if len(prompt) + params.max_new_tokens > max_seq_len:
            raise ValueError(
                f"prompts[{i}] has {len(prompt)} tokens and max_new_tokens={params.max_new_tokens}: "
                f"together {len(prompt) + params.max_new_tokens} > max_seq_len={max_seq_len}"
            )
