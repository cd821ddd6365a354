"""Drafting beside verification (`engine.overlap`, `placement.ahead`) and the drafter on its own cores
(`engine.drafter_device`): the output is decided by verification alone.

Greedy: overlapped output equals plain decoding's token for token on a ragged batch (prompts of 2–9 tokens, per-prompt
budgets, fewer slots than prompts), on the target's cores and on a core of its own. Sampled: under the invariant
sampler it equals plain decoding's for the seed; under the rejection sampler the emitted tokens follow the target's
processed distribution (the conditional χ² of `test_engine_distribution`, α = 1e-3 per test; 1,000 rows × 50 tokens =
50k tokens each). The drafter agrees with the target often (a noisy copy), so both of post-verify's paths run: rows
that keep what was drafted ahead, rows rolled back (each test asserts both happened).
"""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch
from distribution_stats import ALPHA, conditional_chi2_pvalue, reference_probs
from tiny_models import build_lm, make_prompts, noisy_copy, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

PROMPTS = make_prompts(24, 2, 9)
BUDGETS = [8 + 3 * (i % 7) for i in range(len(PROMPTS))]  # 8..26 new tokens
TWO_CORES = len(os.sched_getaffinity(0)) >= 2
PLACEMENTS = [None, pytest.param("cpu:1", marks=pytest.mark.skipif(not TWO_CORES, reason="needs 2 cores"))]


def generate(drafter, params: SamplingParams, prompts=PROMPTS, budgets=BUDGETS, **config):
    engine = SpecEngine(tiny_lm(), drafter, EngineConfig(max_batch_size=7, max_seq_len=40, **config))
    return engine, engine.generate(prompts, params, max_new_tokens=budgets)


@functools.cache
def plain(temperature: float, top_k: int = 0) -> tuple[tuple[int, ...], ...]:
    params = SamplingParams(max_new_tokens=26, temperature=temperature, top_k=top_k, seed=7)
    return tuple(tuple(r.completion_ids) for r in generate(None, params, gamma=0)[1])


def assert_both_paths(engine: SpecEngine) -> None:
    drafter = engine.drafter
    assert 0 < drafter.rows_kept_ahead < drafter.rows_ahead  # work kept somewhere, thrown away elsewhere


@pytest.mark.parametrize("drafter_device", PLACEMENTS)
@pytest.mark.parametrize("sampler", ["rejection", "invariant"])
def test_greedy_overlapped_equals_plain(drafter_device, sampler):
    engine, out = generate(noisy_copy(), SamplingParams(max_new_tokens=26, temperature=0.0), gamma=3,
                           sampler=sampler, overlap=True, drafter_device=drafter_device)
    assert tuple(tuple(r.completion_ids) for r in out) == plain(0.0)
    assert_both_paths(engine)


@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.7, 5)])
def test_invariant_overlapped_equals_plain(temperature, top_k):
    params = SamplingParams(max_new_tokens=26, temperature=temperature, top_k=top_k, seed=7)
    engine, out = generate(noisy_copy(), params, gamma=3, sampler="invariant", overlap=True)
    assert tuple(tuple(r.completion_ids) for r in out) == plain(temperature, top_k)
    assert_both_paths(engine)


def test_placed_drafter_drafts_what_the_serial_one_does():
    """The same seeded call with the drafter placed on its own core, drafting ahead or not, proposes and keeps
    exactly the serial engine's drafts (rejection sampler: tokens depend on the drafts)."""
    params = SamplingParams(max_new_tokens=26, temperature=1.0, seed=3)
    serial, expected = generate(noisy_copy(), params, gamma=3)
    for config in (dict(overlap=True), dict(drafter_device="cpu:1" if TWO_CORES else None, overlap=True)):
        engine, out = generate(noisy_copy(), params, gamma=3, **config)
        assert [r.completion_ids for r in out] == [r.completion_ids for r in expected]
        assert engine.stats.accepted == serial.stats.accepted


VOCAB = 16
ROWS, NEW_TOKENS = 1000, 50


@functools.cache
def distribution_models():
    target = build_lm("llama", "sdpa", vocab=VOCAB, hidden=16, layers=1, seed=11, logit_scale=10)
    drafter = copy.deepcopy(target)  # a partly agreeing drafter: rows keep whole steps, and reject
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        w = drafter.lm_head.weight
        w.add_(0.6 * w.std() * torch.randn(w.shape, generator=gen))
    return target, drafter


@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.7, 4)])
def test_overlapped_rejection_sampling_is_lossless(temperature, top_k):
    target, drafter = distribution_models()
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=temperature, top_k=top_k, seed=11)
    config = EngineConfig(max_batch_size=ROWS // 2, max_seq_len=6 + NEW_TOKENS, gamma=3, overlap=True)
    engine = SpecEngine(target, drafter, config)
    rollouts = engine.generate(make_prompts(ROWS, 2, 6, vocab=VOCAB, seed=3), params)
    assert_both_paths(engine)
    probs, tokens = reference_probs(target, rollouts, params)
    assert tokens.numel() == ROWS * NEW_TOKENS
    assert conditional_chi2_pvalue(probs, tokens) > ALPHA


@pytest.mark.parametrize("overlap", [False, True])
def test_the_transfer_path_drafts_as_on_one_device(overlap):
    """The path of a drafter on another device than the target's (a CPU drafter beside a CUDA target: rows copied to
    it, its own copy of the noise, the proposal copied back), run on one CPU by naming the target's device
    "cpu:0" (torch holds it unequal to the drafter's "cpu"): the same tokens and drafts kept as the serial engine."""
    params = SamplingParams(max_new_tokens=26, temperature=1.0, seed=3)
    serial, expected = generate(noisy_copy(), params, gamma=3)
    engine = SpecEngine(tiny_lm(), noisy_copy(), EngineConfig(max_batch_size=7, max_seq_len=40, gamma=3,
                                                              drafter_device="cpu", overlap=overlap))
    engine.drafter.target_device = torch.device("cpu", 0)
    out = engine.generate(PROMPTS, params, max_new_tokens=BUDGETS)
    assert [r.completion_ids for r in out] == [r.completion_ids for r in expected]
    assert engine.stats.accepted == serial.stats.accepted


def test_auto_overlap_measures_both_kinds_and_keeps_the_output():
    engine, out = generate(noisy_copy(), SamplingParams(max_new_tokens=26, temperature=0.0), gamma=3,
                           overlap="auto")
    assert tuple(tuple(r.completion_ids) for r in out) == plain(0.0)
    assert {overlapped for _, overlapped in engine.speculation.overlap.steps} == {False, True}
