"""Fail closed: one bad request or drafter never corrupts another row, a later request or a later call.

A target made non-finite for one token id (a NaN embedding row: any prompt holding it fills its
slot's K/V with NaN) and a drafter with NaN weights are the faults; the references are fresh
engines and row-alone runs, compared token for token (greedy, fp32), and no-raise checks for T = 1.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings

import pytest
import torch
from tiny_models import make_prompts, noisy_copy, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.version import DrafterVersion

BAD = 13  # a token id the clean prompts below never produce (greedy or T = 1)
CONFIG = dict(max_batch_size=3, max_seq_len=64, gamma=3)
GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7)  # a seed whose clean rows never draw BAD
CLEAN = [p for p in make_prompts(12, 3, 12, seed=3) if BAD not in p]
BAD_PROMPT = [3, 7, BAD, 22, 40, 9, 11, 2, 30, 6]  # longer than most clean prompts: stale slots lie past them


@functools.cache
def nan_token_target() -> torch.nn.Module:
    model = copy.deepcopy(tiny_lm("llama"))
    with torch.no_grad():
        model.model.embed_tokens.weight[BAD] = float("nan")
    return model


def drafter_state(nan: bool = False) -> dict[str, torch.Tensor]:
    state = {n: p.detach().clone() for n, p in noisy_copy("llama").named_parameters()}
    return {n: torch.full_like(t, float("nan")) for n, t in state.items()} if nan else state


def engine(drafter: bool = True, nan_token: bool = True, **overrides) -> SpecEngine:
    """An engine over the NaN-token target (or the clean one) and a fresh copy of a good drafter."""
    target = nan_token_target() if nan_token else tiny_lm("llama")
    return SpecEngine(target, copy.deepcopy(noisy_copy("llama")) if drafter else None,
                      EngineConfig(**(CONFIG | overrides)))


def completions(rollouts) -> list[tuple[list[int], str]]:
    return [(r.completion_ids, r.finish_reason) for r in rollouts]


def acceptance(rollouts) -> float:
    return sum(r.num_accepted for r in rollouts) / sum(r.num_drafted for r in rollouts)


def test_nan_prompt_leaves_no_trace_in_its_slot():
    used = engine(max_batch_size=2)
    first = used.generate([BAD_PROMPT, *CLEAN[:3]], GREEDY)  # later requests reuse the bad row's slot
    assert completions(first[1:]) == completions(engine(max_batch_size=2).generate(CLEAN[:3], GREEDY))
    later = [CLEAN[0][:3], CLEAN[1] + CLEAN[2]]  # a short row in the poisoned slot, a long one beside it
    assert completions(used.generate(later, GREEDY)) == completions(engine(max_batch_size=2).generate(later, GREEDY))


def test_drafter_good_nan_good_restores_acceptance():
    used, fresh = engine(nan_token=False), engine(nan_token=False)
    used.generate(CLEAN, GREEDY)
    used.load_drafter(DrafterVersion(1, drafter_state(nan=True)))
    with pytest.warns(RuntimeWarning, match="drafter version 1"):
        used.generate(CLEAN, SAMPLED)  # must not raise
    used.load_drafter(DrafterVersion(2, drafter_state()))
    restored, reference = used.generate(CLEAN, GREEDY), fresh.generate(CLEAN, GREEDY)
    assert completions(restored) == completions(reference)
    assert acceptance(restored) == acceptance(reference) > 0.5
    assert completions(used.generate(CLEAN, SAMPLED)) == completions(fresh.generate(CLEAN, SAMPLED))


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_nonfinite_target_row_fails_alone(params):
    long, short = CLEAN[0] + CLEAN[1], CLEAN[2][:3]
    # The bad row's slot is refilled by moving the short row into it (nothing waits in the queue).
    out = engine().generate([long, BAD_PROMPT, short], params)
    assert out[1].finish_reason == "error" and out[1].completion_ids == []
    assert "non-finite" in out[1].error and "completion token 0" in out[1].error
    assert all(r.error is None for r in (out[0], out[2]))
    if params.greedy:
        assert completions([out[0], out[2]]) == completions(engine().generate([long, short], params))
    for r in (out[0], out[2]):
        assert r.finish_reason == "length" and len(r.completion_ids) == params.max_new_tokens
        assert all(math.isfinite(x) for x in r.logprobs)


def test_failed_row_keeps_the_tokens_before_its_fault():
    prompt = CLEAN[0]
    clean = engine(nan_token=False).generate([prompt], GREEDY)[0].completion_ids
    k = next(i for i in range(3, len(clean)) if clean[i] not in prompt + clean[:i])
    target = copy.deepcopy(tiny_lm("llama"))
    with torch.no_grad():
        target.model.embed_tokens.weight[clean[k]] = float("nan")  # fine until the row feeds clean[k]
    out = SpecEngine(target, copy.deepcopy(noisy_copy("llama")), EngineConfig(**CONFIG)).generate([prompt], GREEDY)[0]
    kept = len(out.completion_ids)
    assert out.finish_reason == "error" and 0 < kept <= k + 1
    assert out.completion_ids == clean[:kept] and out.logprobs == pytest.approx(
        engine(nan_token=False).generate([prompt], GREEDY)[0].logprobs[:kept], abs=1e-5)
    assert f"completion token {kept} " in out.error


def test_nonfinite_drafter_drops_its_drafts_and_warns_once_per_call():
    # A clean target: random drafts holding the NaN token would fail their rows (as they would alone).
    spec, plain = engine(nan_token=False), engine(drafter=False, nan_token=False)
    spec.load_drafter(DrafterVersion(3, drafter_state(nan=True)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = spec.generate(CLEAN, GREEDY)
    raised = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(raised) == 1 and "drafter version 3" in str(raised[0].message)
    assert completions(out) == completions(plain.generate(CLEAN, GREEDY))
    assert spec.stats.drafter_nonfinite_rows == spec.stats.spec_row_steps > 0
    assert spec.stats.accepted == 0
    with pytest.warns(RuntimeWarning, match="drafter version 3"):
        sampled = spec.generate(CLEAN, SAMPLED)
    assert all(r.finish_reason == "length" for r in sampled)


def test_stats_traces_stay_bounded():
    small, large = engine(stats_trace_steps=8), engine(stats_trace_steps=4096)
    for e in (small, large):
        e.generate(CLEAN, GREEDY)
        e.generate(CLEAN, GREEDY)
    assert len(small.stats.gamma_per_step) == len(small.stats.live_rows_per_step) == 8 < small.stats.steps
    assert list(small.stats.gamma_per_step) == list(large.stats.gamma_per_step)[-8:]
    assert small.stats.mean_accepted_len == large.stats.mean_accepted_len
    assert small.stats.to_dict()["gamma_per_step"] == list(small.stats.gamma_per_step)


def test_batch_metrics_outlive_a_full_trace_window():
    small, large = engine(stats_trace_steps=8), engine(stats_trace_steps=4096)
    batches = []
    for e in (small, large):
        e.generate(CLEAN, GREEDY)
        before = e.stats.totals()
        e.generate(CLEAN[:5], GREEDY)
        batches.append(e.stats.since(before))
    assert batches[0].mean_gamma == batches[1].mean_gamma == 3
    assert batches[0].mean_live_rows == batches[1].mean_live_rows
    assert batches[0].mean_accepted_len == batches[1].mean_accepted_len
