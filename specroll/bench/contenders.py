"""The systems a benchmark races: HF `generate`, HF assisted generation, and specroll engines.

Each contender turns (prompts, per-prompt budgets, sampling) into a number of generated tokens, so
a benchmark can time them interleaved on the same models and prompts. Tokens are counted up to and
including the first stop token, for every system alike.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Generator
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine


@dataclass
class Contender:
    name: str
    run: Callable[[list[list[int]], list[int], SamplingParams], int]  # → tokens generated
    max_batch: int | None = None  # HF assisted generation refuses batch size > 1
    engine: SpecEngine | None = None
    # The same work one engine step per `next` (returns the token count): lets a race run several
    # engines in lockstep. None for systems that cannot be stepped (HF).
    steps: Callable[[list[list[int]], list[int], SamplingParams], Generator[int, None, int]] | None = None


def _count_until_stop(rows: torch.Tensor, stop_ids: tuple[int, ...], budgets: list[int]) -> int:
    total = 0
    for row, budget in zip(rows.tolist(), budgets):
        row = row[:budget]
        hits = [i for i, t in enumerate(row) if t in stop_ids]
        total += hits[0] + 1 if hits else len(row)
    return total


def hf_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A private copy in HF's own weight layout, as `from_pretrained` gives it to a user.

    specroll's engine re-lays out the weights of the models it runs (`rollout.models.lean`: fused, and on CPU
    input-major); the HF contenders must not inherit that, so each gets a contiguous copy.
    """
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for param in clone.parameters():
            param.data = param.data.contiguous()
    return clone


def _hf_sampling_kwargs(params: SamplingParams) -> dict:
    if params.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": params.temperature, "top_k": params.top_k or None,
            "top_p": params.top_p}


def hf_generate(target: PreTrainedModel, pad_id: int) -> Contender:
    """Batched `model.generate` with left padding — what TRL does without vLLM."""
    target = hf_copy(target)

    @torch.inference_mode()
    def run(prompts: list[list[int]], budgets: list[int], params: SamplingParams) -> int:
        width = max(map(len, prompts))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = target.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max(budgets), min_new_tokens=0,
            eos_token_id=list(params.stop_token_ids) or None, pad_token_id=pad_id,
            **_hf_sampling_kwargs(params),
        )
        return _count_until_stop(out[:, width:], params.stop_token_ids, budgets)

    return Contender("hf_generate", run)


def hf_assisted(target: PreTrainedModel, drafter: PreTrainedModel, pad_id: int,
                num_assistant_tokens: int | None) -> Contender:
    """HF assisted generation, one prompt at a time; `None` keeps the assistant's default schedule."""
    target = hf_copy(target)
    assistant = hf_copy(drafter)
    assistant.generation_config = copy.deepcopy(drafter.generation_config)
    if num_assistant_tokens is not None:
        assistant.generation_config.num_assistant_tokens = num_assistant_tokens
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0

    @torch.inference_mode()
    def run(prompts: list[list[int]], budgets: list[int], params: SamplingParams) -> int:
        total = 0
        for prompt, budget in zip(prompts, budgets):
            out = target.generate(
                input_ids=torch.tensor([prompt]), max_new_tokens=budget, min_new_tokens=0,
                assistant_model=assistant, eos_token_id=list(params.stop_token_ids) or None,
                pad_token_id=pad_id, **_hf_sampling_kwargs(params),
            )
            total += _count_until_stop(out[:, len(prompt):], params.stop_token_ids, [budget])
        return total

    name = "hf_assisted_default" if num_assistant_tokens is None else f"hf_assisted_k{num_assistant_tokens}"
    return Contender(name, run, max_batch=1)


def specroll(target: PreTrainedModel, drafter: PreTrainedModel | None, gamma: int | str, max_batch: int,
             max_seq_len: int, name: str | None = None, sampler: str = "rejection") -> Contender:
    engine = SpecEngine(
        target, drafter if gamma != 0 else None,
        EngineConfig(max_batch_size=max_batch, max_seq_len=max_seq_len, gamma=gamma, sampler=sampler),
    )

    def run(prompts: list[list[int]], budgets: list[int], params: SamplingParams) -> int:
        rollouts = engine.generate(prompts, params, max_new_tokens=budgets)
        return sum(len(r.completion_ids) for r in rollouts)

    def steps(prompts: list[list[int]], budgets: list[int], params: SamplingParams) -> Generator[int, None, int]:
        rollouts = yield from engine.generate_steps(prompts, params, max_new_tokens=budgets)
        return sum(len(r.completion_ids) for r in rollouts)

    default = "specroll_plain" if gamma == 0 else f"specroll_gamma_{gamma}"
    return Contender(name or default, run, engine=engine, steps=steps)
