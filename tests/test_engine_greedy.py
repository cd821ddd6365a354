"""Greedy exactness: speculative greedy output equals HF `generate` greedy output token for token.

The reference is computed once per (architecture, attention) with `model.generate`, batching only
prompts of equal length (no padding, so the reference itself is exact). Cases cover every value of
every axis — batch size {1, 7, 32}, γ {1, 3, 8}, drafter {target itself, random, partly agreeing},
architecture {Llama, Qwen2, Qwen3}, attention {eager, sdpa} — with drafter × γ fully crossed and
every (architecture, attention) pair present, instead of the full (slow) cartesian product.
"""

from __future__ import annotations

import functools

import pytest
import torch
from tiny_models import build_lm, make_prompts, noisy_copy, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

NEW_TOKENS = 24
PROMPTS = make_prompts(32, 2, 9)  # lengths 2..9


@functools.cache
def hf_greedy(arch: str, attn: str) -> tuple[tuple[int, ...], ...]:
    model = tiny_lm(arch, attn)
    out: dict[int, list[int]] = {}
    for length in sorted({len(p) for p in PROMPTS}):
        idx = [i for i, p in enumerate(PROMPTS) if len(p) == length]
        ids = torch.tensor([PROMPTS[i] for i in idx])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        for row, i in enumerate(idx):
            out[i] = gen[row, length:].tolist()
    return tuple(tuple(out[i]) for i in range(len(PROMPTS)))


def make_drafter(kind: str, arch: str, attn: str):
    if kind == "self":
        return tiny_lm(arch, attn)
    if kind == "random":  # an unrelated smaller model over the same vocabulary
        return tiny_lm(arch, attn, hidden=16, layers=1, seed=7)
    return noisy_copy(arch, attn)


ARCH_ATTN = [("llama", "eager"), ("qwen2", "sdpa"), ("qwen3", "eager"),
             ("llama", "sdpa"), ("qwen2", "eager"), ("qwen3", "sdpa")]
CASES = [
    # (drafter, γ, batch size, architecture, attention)
    (drafter, gamma, batch, *ARCH_ATTN[i % 6])
    for i, (drafter, gamma, batch) in enumerate([
        ("self", 1, 32), ("self", 3, 7), ("self", 8, 1),
        ("random", 1, 7), ("random", 3, 1), ("random", 8, 32),
        ("partial", 1, 1), ("partial", 3, 32), ("partial", 8, 7),
    ])
]


@pytest.mark.parametrize(("drafter_kind", "gamma", "batch", "arch", "attn"), CASES)
def test_speculative_greedy_equals_hf_generate(drafter_kind, gamma, batch, arch, attn):
    # Batch size 1 runs a few prompts only (one row at a time is slow and adds no coverage).
    num_prompts = 5 if batch == 1 else len(PROMPTS)
    engine = SpecEngine(tiny_lm(arch, attn), make_drafter(drafter_kind, arch, attn),
                        EngineConfig(max_batch_size=batch, max_seq_len=40, gamma=gamma))
    rollouts = engine.generate(PROMPTS[:num_prompts], SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0))

    expected = hf_greedy(arch, attn)[:num_prompts]
    assert tuple(tuple(r.completion_ids) for r in rollouts) == expected
    # The drafter kinds mean what they claim, so the three regimes really are exercised.
    acceptance = engine.stats.acceptance_rate
    if drafter_kind == "self":
        assert engine.stats.accepted == engine.stats.drafted > 0
    elif drafter_kind == "random":
        assert acceptance < 0.1
    else:  # some drafts rejected, many accepted
        assert 0.1 < acceptance < 0.99


@pytest.mark.parametrize(("arch", "attn"), [("llama", "sdpa"), ("qwen3", "eager")])
def test_plain_decoding_greedy_equals_hf_generate(arch, attn):
    engine = SpecEngine(tiny_lm(arch, attn), None, EngineConfig(max_batch_size=7, max_seq_len=40, gamma=0))
    rollouts = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0))
    assert tuple(tuple(r.completion_ids) for r in rollouts) == hf_greedy(arch, attn)
    assert engine.stats.drafted == 0


def test_drafter_of_other_architecture_keeps_greedy_exact():
    target, drafter = tiny_lm("qwen3", "sdpa"), build_lm("llama", "eager", hidden=16, layers=1, seed=3)
    engine = SpecEngine(target, drafter, EngineConfig(max_batch_size=32, max_seq_len=40, gamma=3))
    rollouts = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0))
    assert tuple(tuple(r.completion_ids) for r in rollouts) == hf_greedy("qwen3", "sdpa")
