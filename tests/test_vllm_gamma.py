"""gamma: auto on vLLM (`integrations.vllm.gamma`): drafts per live batch size from vLLM's step costs.

The choice is tested on injected step costs (never on this machine's timings): k = 0 where no k beats plain
decoding, the most drafts where they are cheap and kept, fewer as acceptance falls. Through the public path on
vLLM (tiny fp32 Llamas, the drafter a copy of the target so every draft it makes is kept): the engine times its
steps at start, applies a schedule to vLLM's scheduler, and with a schedule that switches speculation off above
two live rows and on below — the live batch shrinks as ragged budgets run out — greedy output is the target's token
for token and every draft made after speculation switches back on is still kept (the draft model's cache followed
the steps it did not draft in).
"""

from __future__ import annotations

import itertools

import pytest

from specroll.integrations.vllm.gamma import GammaSchedule, StepTimes, alpha_from_counts, best_k, expected_tokens


def schedule(times: StepTimes, alpha: float, max_gamma: int = 4, max_rows: int = 64) -> GammaSchedule:
    return GammaSchedule(times, max_gamma, max_rows, prior=alpha)


# a step at 1 row costs its forward plus little per draft; at 64 rows each draft position costs as much as a token
COSTS = StepTimes([1, 64], [[0.010, 0.011, 0.012, 0.013, 0.014], [0.100, 0.200, 0.300, 0.400, 0.500]])


def test_the_most_drafts_where_they_are_cheap_and_none_where_no_k_pays():
    lookup = schedule(COSTS, alpha=0.8).choose()
    assert lookup[1] == 4
    assert lookup[64] == 0  # 1.8 tokens for 2x the time at k = 1: plain decoding wins
    assert all(a >= b for a, b in itertools.pairwise(lookup[1:]))  # dearer steps never get more drafts


def test_fewer_drafts_as_acceptance_falls_and_none_below_break_even():
    ks = [best_k(COSTS.at(1), alpha) for alpha in (0.95, 0.6, 0.2, 0.05)]
    assert ks == sorted(ks, reverse=True) and ks[0] == 4 and ks[-1] == 0
    sched = schedule(COSTS, alpha=0.5)
    assert 0 < sched.break_even(1) < 0.2 and sched.break_even(64) == 1.0


def test_acceptance_is_read_back_from_the_counts_it_would_produce():
    for alpha in (0.1, 0.5, 0.9):
        for k in (1, 3, 5):
            kept = expected_tokens(alpha, k) - 1  # drafts kept per step
            assert alpha_from_counts(kept, k) == pytest.approx(alpha, abs=1e-6)
    sched = schedule(COSTS, alpha=0.6)
    sched.observe(drafted=3000, accepted=round(1000 * (expected_tokens(0.9, 3) - 1)), steps=1000)
    assert sched.alpha() == pytest.approx(0.9, abs=0.01)
    sched.reset(0.3)
    assert sched.alpha() == 0.3


def test_a_schedule_turned_off_by_low_acceptance_tries_drafting_again_as_the_evidence_fades():
    sched = schedule(COSTS, alpha=0.8)
    sched.observe(drafted=3000, accepted=0, steps=1000)  # a spell where nothing was kept
    assert sched.choose()[1] == 0
    calls = 0
    while sched.choose()[1] == 0:  # calls that draft nothing bring no evidence, but age what there is
        sched.observe(drafted=0, accepted=0, steps=0)
        calls += 1
    assert 5 < calls < 40 and sched.choose()[1] > 0


def test_step_costs_interpolate_between_and_extend_past_the_timed_sizes():
    assert COSTS.at(1) == COSTS.seconds[0] and COSTS.at(64) == pytest.approx(COSTS.seconds[1])
    mid = COSTS.at(32)
    assert all(a < m < b for a, m, b in zip(COSTS.seconds[0], mid, COSTS.seconds[1]))
    sched = schedule(COSTS, alpha=0.8)
    sched.lookup = [0, 4, 4, 2, 0, 0]
    assert sched.ranges() == [(1, 2, 4), (3, 3, 2), (4, 5, 0)]


def test_on_vllm_a_schedule_switching_speculation_per_batch_size_is_exact_and_keeps_the_drafter_in_step():
    pytest.importorskip("vllm")
    from tiny_models import VLLM_SHAPE, build_lm, hf_greedy, make_prompts

    from specroll.integrations.vllm.engine import VllmEngine
    from specroll.integrations.vllm.settings import VllmSettings
    from specroll.rollout import EngineConfig, SamplingParams

    target = build_lm("llama", **VLLM_SHAPE, layers=2, seed=21)
    drafter = build_lm("llama", **VLLM_SHAPE, layers=2, seed=21)
    drafter.load_state_dict(target.state_dict())
    config = EngineConfig(gamma="auto", max_gamma=3, drafters=("model",), max_batch_size=8, max_seq_len=64)
    engine = VllmEngine.from_models(target, drafter, config, VllmSettings(kv_cache_gib=1))
    try:
        timed = engine.gamma_schedule.times
        assert timed.rows == [1, 2, 4, 8] and all(len(s) == 4 and min(s) > 0 for s in timed.seconds)
        # injected costs: drafting pays at 1-2 live rows only
        cheap, dear = [0.01, 0.011, 0.012, 0.013], [0.01, 0.03, 0.05, 0.07]
        engine.gamma_schedule.times = StepTimes([1, 2, 3, 8], [cheap, cheap, dear, dear])
        prompts = make_prompts(6, 2, 7, vocab=VLLM_SHAPE["vocab"], seed=9)
        budgets = [4, 8, 12, 16, 20, 24]
        out = engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=0.0),
                              max_new_tokens=budgets)
        assert engine.gamma_schedule.ranges() == [(1, 2, 3), (3, 8, 0)]
        for r, p, b in zip(out, prompts, budgets):
            assert r.completion_ids == hf_greedy(target, p, b)
        drafted = sum(r.num_drafted for r in out)
        assert drafted > 0 and sum(r.num_accepted for r in out) == drafted  # a copy of the target: all kept
        assert out[0].num_drafted == 0  # the shortest row finished while 6 rows were live: never drafted
    finally:
        del engine
