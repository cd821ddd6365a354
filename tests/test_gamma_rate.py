"""`SimpleGamma`, the simple auto-γ policy: its choice on synthetic cost models, its acceptance
estimate and its time corrections (deterministic: synthetic times and counts, no clock)."""

from __future__ import annotations

import pytest

from specroll.rollout.gamma.cost_model import CostModel
from specroll.rollout.gamma.policy import StepOutcome, StepShape
from specroll.rollout.gamma.simple import PROBE_EVERY, SimpleGamma
from specroll.rollout.models.timing import ForwardTimes

BATCHES = [1, 4, 16, 64]
QUERIES = list(range(1, 10))


def synthetic(target_time, drafter_time) -> CostModel:
    """A cost model from closed-form per-forward times (batch, query) → seconds."""
    t = ForwardTimes(BATCHES, QUERIES, [[target_time(b, q) for q in QUERIES] for b in BATCHES])
    d = ForwardTimes(BATCHES, [1, 2], [[drafter_time(b, q) for q in (1, 2)] for b in BATCHES])
    return CostModel(target=t, drafter=d)


def counts(reached: list[int], kept: list[int]) -> list[list[int]]:
    """`acceptance_counts`' layout with every row in start state 0."""
    return [reached, kept, [0] * len(reached), [0] * len(kept)]


def observed(policy: SimpleGamma, reached: list[int], kept: list[int], greedy: bool = True, steps: int = 50,
             rows: int = 4) -> SimpleGamma:
    """Fold `steps` identical steps of drafts into the policy, each timed exactly as calibrated."""
    gamma = len(reached)
    for _ in range(steps):
        verify, draft = policy.calibrated_times(rows, 64)
        policy.observe(StepShape(rows), StepOutcome(gamma=gamma, rows=rows, counts=counts(reached, kept),
                                                    emitted=0, stopped=0, seconds=verify[gamma] + draft[gamma],
                                                    draft_seconds=draft[gamma]), greedy)
    return policy


def test_first_step_drafts_max_gamma_to_measure_every_position():
    policy = SimpleGamma(synthetic(lambda b, q: 1e-2, lambda b, q: 1e-3), max_gamma=6, decay=0.9)
    assert policy.choose(StepShape(4), greedy=True) == 6


def test_acceptance_is_conditional_per_position():
    policy = SimpleGamma(synthetic(lambda b, q: 1e-2, lambda b, q: 1e-3), max_gamma=3, decay=0.0)
    # 4000 rows: position 1 kept by 3 of 4, position 2 by 2 of the 3 that reached it, position 3 by 1 of 2.
    observed(policy, [4000, 3000, 2000], [3000, 2000, 1000], steps=1)
    assert policy.alpha(True) == pytest.approx([0.75, 2 / 3, 0.5], abs=0.005)
    assert policy.expected_tokens(True)[3] == pytest.approx(1 + 0.75 + 0.5 + 0.25, abs=0.01)
    assert policy.alpha(False) == pytest.approx([0.6] * 3)  # the sampled mode saw nothing: the prior


def test_all_kept_and_nearly_free_drafts_pick_max_gamma():
    policy = observed(SimpleGamma(synthetic(lambda b, q: 1e-2, lambda b, q: 1e-9), max_gamma=8, decay=0.9),
                      [4] * 8, [4] * 8)
    assert [policy.choose(StepShape(b), greedy=True) for b in BATCHES] == [8, 8, 8, 8]


def test_verification_cost_growing_with_the_batch_turns_speculation_off():
    # A forward costs the same for 1 or 9 tokens at small batches and grows with tokens at large ones.
    cost = synthetic(lambda b, q: 1e-2 * max(1.0, b * q / 16), lambda b, q: 1e-3 * max(1.0, b / 16))
    policy = observed(SimpleGamma(cost, max_gamma=8, decay=0.9), [10] * 8, [7] * 8)  # α = 0.7
    assert policy.choose(StepShape(1), greedy=True) >= 2
    assert policy.choose(StepShape(64), greedy=True) == 0


def test_plain_decoding_probes_the_best_gamma_now_and_then():
    cost = synthetic(lambda b, q: 1e-3 * b * q, lambda b, q: 1e-4 * b)
    policy = observed(SimpleGamma(cost, max_gamma=4, decay=0.9), [10] * 4, [1] * 4, greedy=False)  # α ≈ 0.1
    chosen = [policy.choose(StepShape(16), greedy=False) for _ in range(2 * PROBE_EVERY)]
    assert [i for i, g in enumerate(chosen) if g] == [PROBE_EVERY - 1, 2 * PROBE_EVERY - 1]


def test_long_contexts_make_verification_dearer():
    short = synthetic(lambda b, q: 1e-2, lambda b, q: 1e-3)
    long = synthetic(lambda b, q: 1e-2 + 2e-2 * b * q, lambda b, q: 1e-3)
    cost = CostModel(target=short.target, drafter=short.drafter, target_long=long.target, contexts=(64, 512))
    policy = observed(SimpleGamma(cost, max_gamma=8, decay=0.9), [10] * 8, [7] * 8)
    assert policy.choose(StepShape(4, context=64), greedy=True) >= 4
    assert policy.choose(StepShape(4, context=512), greedy=True) == 0


def test_slow_drafts_and_a_step_overhead_are_learnt_from_measured_steps():
    # Measured steps: drafts twice their calibrated time and 5 ms per step beyond the forwards at 4 rows.
    policy = SimpleGamma(synthetic(lambda b, q: 1e-2 + 1e-3 * b * q, lambda b, q: 1e-3), max_gamma=8, decay=0.9)
    verify, draft = policy.calibrated_times(4, 64)
    for _ in range(60):
        policy.observe(StepShape(4), StepOutcome(gamma=2, rows=4, counts=counts([4, 4], [3, 3]), emitted=0,
                                                 stopped=0, seconds=verify[2] + 5e-3 + 2 * draft[2],
                                                 draft_seconds=2 * draft[2]), True)
    expect = [v + 5e-3 + 2 * d for v, d in zip(verify, draft)]
    assert policy.step_times(4, 64) == pytest.approx(expect, rel=1e-3)
    assert policy.step_times(5, 64)[0] == pytest.approx(policy.calibrated_times(5, 64)[0][0] + 5e-3, rel=1e-3)


def test_one_stalled_step_moves_the_corrections_little():
    policy = SimpleGamma(synthetic(lambda b, q: 1e-2, lambda b, q: 1e-3), max_gamma=4, decay=0.9)
    verify, draft = policy.calibrated_times(4, 64)

    def step(slow: float) -> None:
        policy.observe(StepShape(4), StepOutcome(gamma=2, rows=4, counts=counts([4, 4], [3, 3]), emitted=0,
                                                 stopped=0, seconds=slow * (verify[2] + 5e-3 + draft[2]),
                                                 draft_seconds=slow * draft[2]), True)

    for _ in range(30):
        step(1.0)
    before = policy.step_times(4, 64)
    step(100.0)  # a stalled step (GC, another process)
    assert all(1.0 <= after / b < 1.25 for after, b in zip(policy.step_times(4, 64), before))


def test_a_fixed_step_overhead_makes_longer_drafts_pay():
    cost = synthetic(lambda b, q: 1e-2 + 1e-3 * b * q, lambda b, q: 1e-3)
    policy = observed(SimpleGamma(cost, max_gamma=8, decay=0.9), [10] * 8, [8] * 8, rows=16)
    lean = policy.choose(StepShape(16), greedy=True)
    policy.overhead[16] = 0.05
    assert policy.choose(StepShape(16), greedy=True) > lean


def test_narrow_verifies_the_width_that_pays():
    # Verifying w drafts costs 10 ms + 2 ms per draft: (1 + kept) / seconds peaks at w = 2.
    policy = SimpleGamma(synthetic(lambda b, q: 8e-3 + 2e-3 * q, lambda b, q: 1e-3), max_gamma=4, decay=0.9)
    kept = [0.0, 0.9, 1.5, 1.6, 1.65]  # one row: expected drafts kept if the first w are verified
    assert policy.narrow(StepShape(1), kept) == 2


def test_break_even_acceptance_follows_the_predicted_step_times():
    policy = SimpleGamma(synthetic(lambda b, q: 1e-2, lambda b, q: 1e-3), max_gamma=4, decay=0.9)
    # Steps of 10, 11, 12, … ms: γ = 1 pays first, once (1 + α) / 11 > 1 / 10.
    assert policy.break_even_acceptance(4, 64) == pytest.approx(0.1, abs=1e-6)
