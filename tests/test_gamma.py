"""Auto γ: the choice rule on synthetic cost models, the acceptance estimates and the cost model's
corrections (the engine side is in test_gamma_engine.py)."""

from __future__ import annotations

import pytest
import torch
from gamma_helpers import with_acceptance

from specroll.rollout.gamma.auto import PLAIN_CHECK_FIRST, STICK_WITHIN, AutoGamma
from specroll.rollout.gamma.cost_model import CostModel
from specroll.rollout.gamma.estimate import MEMORY_ROWS, AcceptanceEstimate
from specroll.rollout.gamma.policy import StepShape
from specroll.rollout.models.timing import ForwardTimes

BATCHES = [1, 4, 16, 64]
QUERIES = [1, 2, 3, 5, 9]


def synthetic(target_time, drafter_time) -> CostModel:
    """A cost model from closed-form per-forward times (batch, query) → seconds."""
    t = ForwardTimes(BATCHES, QUERIES, [[target_time(b, q) for q in QUERIES] for b in BATCHES])
    d = ForwardTimes(BATCHES, [1, 2], [[drafter_time(b, q) for q in (1, 2)] for b in BATCHES])
    return CostModel(target=t, drafter=d)


def test_free_drafts_all_accepted_picks_max_gamma():
    cost = synthetic(lambda b, q: 1e-2, lambda b, q: 1e-9)
    policy = with_acceptance(AutoGamma(cost, max_gamma=8, decay=0.9), 1.0)
    assert [policy.choose(StepShape(b), greedy=True) for b in BATCHES] == [8, 8, 8, 8]


def test_linear_target_cost_and_low_acceptance_picks_plain():
    cost = synthetic(lambda b, q: 1e-3 * b * q, lambda b, q: 1e-4 * b)
    policy = with_acceptance(AutoGamma(cost, max_gamma=8, decay=0.9), 0.1)
    assert [policy.choose(StepShape(b), greedy=False) for b in BATCHES] == [0, 0, 0, 0]


def test_speculation_switches_off_when_batch_makes_verification_expensive():
    # Small batches: a forward costs the same for 1 or 9 tokens (memory/latency bound); large
    # batches: cost grows with tokens (compute bound). The choice must follow the live batch.
    cost = synthetic(lambda b, q: 1e-2 * max(1.0, b * q / 16), lambda b, q: 1e-3 * max(1.0, b / 16))
    policy = with_acceptance(AutoGamma(cost, max_gamma=8, decay=0.9), 0.7)
    chosen = {b: policy.choose(StepShape(b), greedy=True) for b in BATCHES}
    assert chosen[1] >= 2 and chosen[64] == 0, chosen


def test_acceptance_estimate_is_conditional_per_position():
    est = AcceptanceEstimate(max_gamma=3, decay=0.0)  # decay 0: the last step is the evidence
    accepted = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool).repeat(1000, 1)
    est.update(accepted)
    # position 1: 3 of 4 kept; position 2: 2 of the 3 that reached it; position 3: 1 of 2 (so much
    # evidence that the pull toward the pooled rate is negligible).
    assert est.alpha == pytest.approx([0.75, 2 / 3, 0.5], abs=0.005)
    assert est.expected_tokens(3) == pytest.approx(1 + 0.75 + 0.5 + 0.25, abs=0.01)


def test_one_unlucky_row_does_not_pin_a_deep_position():
    est = AcceptanceEstimate(max_gamma=4, decay=0.9)
    est.update(torch.tensor([[1, 0, 0, 0]], dtype=torch.bool))  # batch of one: position 2 rejected once
    for _ in range(10):
        est.update(torch.tensor([[True]]))  # then γ = 1 steps, all kept
    assert est.alpha[1] > 0.75  # pulled up by the pooled evidence, not stuck near 0


def test_online_correction_rescales_predicted_step_time():
    cost = synthetic(lambda b, q: 1e-2, lambda b, q: 1e-3)
    before = cost.step_time(4, 2)
    for _ in range(50):
        cost.observe(4, 2, 2 * before)
    assert abs(cost.step_time(4, 2) / before - 2) < 0.01


def test_unmeasured_positions_take_the_pooled_acceptance():
    est = AcceptanceEstimate(max_gamma=6, decay=0.0)
    est.update(torch.ones(8, 2, dtype=torch.bool))  # γ = 2 steps, everything kept
    # Positions 3..6 were never drafted: they take the pooled rate (16 of 16 kept), not the 0.6 prior.
    assert min(est.alpha[2:]) > 0.9
    assert est.expected_tokens(6) > 6.0


def test_long_contexts_make_verification_dearer():
    # Short context: a forward costs the same for 1 or 9 tokens; at 512 cached tokens the attention
    # over every row's K/V makes each query token cost extra. The choice must follow the context.
    short = synthetic(lambda b, q: 1e-2, lambda b, q: 1e-3)
    long = synthetic(lambda b, q: 1e-2 + 2e-2 * b * q, lambda b, q: 1e-3)
    cost = CostModel(target=short.target, drafter=short.drafter, target_long=long.target, contexts=(64, 512))
    assert cost.target_time(4, 3, context=64) == pytest.approx(1e-2)
    assert cost.target_time(4, 3, context=288) == pytest.approx(1e-2 + 0.5 * 2e-2 * 12)
    policy = with_acceptance(AutoGamma(cost, max_gamma=8, decay=0.9), 0.7)
    assert policy.choose(StepShape(4, context=64), greedy=True) >= 4
    assert policy.choose(StepShape(4, context=512), greedy=True) == 0


def test_staircase_in_query_length_kept_and_context_cost_interpolated():
    # Every query length is timed at the short context (forward time is a staircase in it), the long
    # context on a coarse grid: what the context adds is interpolated, the staircase kept. The
    # policy's cached per-batch parts must give the same times as the cost model at any context.
    stairs = lambda b, q: 1e-2 * b * (1 + (q + 3) // 4)  # flat within blocks of 4 tokens
    queries = list(range(1, 10))
    short = ForwardTimes(BATCHES, queries, [[stairs(b, q) for q in queries] for b in BATCHES])
    coarse = [1, 2, 3, 5, 9]
    long = ForwardTimes(BATCHES, coarse, [[stairs(b, q) + 1e-3 * b * q for q in coarse] for b in BATCHES])
    drafter = ForwardTimes(BATCHES, [1, 2], [[1e-3 * b] * 2 for b in BATCHES])
    cost = CostModel(target=short, drafter=drafter, target_long=long, contexts=(64, 512))
    for q in queries:
        assert cost.target_time(4, q, context=64) == pytest.approx(stairs(4, q))
        assert cost.target_time(4, q, context=512) == pytest.approx(stairs(4, q) + 4e-3 * q)
    policy = AutoGamma(cost, max_gamma=8, decay=0.9)
    for rows in (1, 3, 16):
        for context in (10, 64, 300, 700):
            verify, draft = policy._raw_step_times(rows, context)
            parts = [cost.raw_step_time(rows, g, context) for g in range(9)]
            assert verify == pytest.approx([v for v, _ in parts]) and draft == pytest.approx([d for _, d in parts])


def test_drafts_past_a_rows_end_are_no_evidence():
    est = AcceptanceEstimate(max_gamma=4, decay=0.0)
    accepted = torch.ones(8, 4, dtype=torch.bool)  # every draft matched the target ...
    decided = torch.tensor([[True, True, False, False]]).repeat(8, 1)  # ... but the rows stopped after 2
    est.update(accepted, decided)
    assert est.reached[0] == [8.0, 8.0, 0.0, 0.0] and est.kept[0] == [8.0, 8.0, 0.0, 0.0]


def test_one_stalled_step_moves_the_prediction_little_and_briefly():
    cost = synthetic(lambda b, q: 1e-2 * q, lambda b, q: 1e-3)

    def step(gamma: int, slow: float = 1.0) -> None:
        verify, draft = cost.raw_step_time(4, gamma)
        cost.observe(4, gamma, slow * (verify + 3e-3 + 2 * draft), draft_seconds=slow * 2 * draft)

    for _ in range(20):
        step(2)
    before = [cost.step_time(4, g) for g in range(9)]
    step(4, slow=10.0)  # a stalled step (GC, another process)
    assert all(1.0 <= cost.step_time(4, g) / b < 1.25 for g, b in enumerate(before))
    for _ in range(200):  # then only γ = 2 again: even γ = 4's own offset fades
        step(2)
    assert [cost.step_time(4, g) for g in range(9)] == pytest.approx(before, rel=0.01)


def test_corrections_learn_slow_drafts_and_a_per_step_overhead():
    # Measured steps: drafts twice their calibrated time, and 5 ms per step beyond the target's
    # forward at 4 rows (8 ms at 16). Learnt from γ = 2 steps alone, the predictions hold for every γ.
    cost = synthetic(lambda b, q: 1e-2 + 1e-3 * b * q, lambda b, q: 1e-3)
    for _ in range(60):
        for rows, extra in ((4, 5e-3), (16, 8e-3)):
            verify, draft = cost.raw_step_time(rows, 2)
            cost.observe(rows, 2, verify + extra + 2 * draft, draft_seconds=2 * draft)
    for rows, extra in ((4, 5e-3), (16, 8e-3), (3, 5e-3), (12, 8e-3)):  # unmeasured sizes: the nearest one's
        for g in range(9):
            verify, draft = cost.raw_step_time(rows, g)
            assert cost.step_time(rows, g) == pytest.approx(verify + extra + 2 * draft, rel=1e-3)
    # A fixed per-step overhead makes a longer draft relatively cheaper: the policy drafts more.
    policy = with_acceptance(AutoGamma(synthetic(lambda b, q: 1e-2 + 1e-3 * b * q, lambda b, q: 1e-3), 8, 0.9), 0.8)
    lean = policy.choose(StepShape(16), greedy=True)
    policy.cost.overhead[16] = 0.05
    assert policy.choose(StepShape(16), greedy=True) > lean


def test_a_calibration_that_overstated_the_forwards_carries_to_other_batch_sizes_as_a_share():
    """Steps at 32 rows ran 40% faster than their calibrated forwards (a negative overhead). Carried to an unmeasured
    12 rows in seconds, it made a plain step take negative time and the break-even acceptance 0.0 (the subword
    demo's target with a fresh head, replayed). Carried as a share it keeps every step time
    positive and the break-even where the measured batch size's relative costs put it."""
    from specroll.rollout.gamma.break_even import break_even_acceptance

    cost = synthetic(lambda b, q: 1e-3 * b * (1 + q), lambda b, q: 1e-4 * b)
    for _ in range(60):
        for gamma in (0, 3):
            verify, draft = cost.raw_step_time(32, gamma)
            cost.observe(32, gamma, 0.6 * verify + draft, draft_seconds=draft)
    assert cost.plain_overhead[32] < -0.02 and cost.overhead[32] < -0.02
    at_32 = break_even_acceptance([cost.step_time(32, g) for g in range(5)])
    for rows in (12, 4, 1):
        times = [cost.step_time(rows, g) for g in range(5)]
        assert min(times) > 0, (rows, times)
        assert break_even_acceptance(times) == pytest.approx(at_32, abs=0.02)  # the costs scale with the batch here
    # A positive overhead (bookkeeping the forwards leave out) still carries over in seconds.
    cost.plain_overhead, cost.overhead = {32: 4e-3}, {32: 4e-3}
    assert cost.step_overheads(4, 2) == [4e-3, 4e-3, 4e-3]


def test_each_gamma_learns_its_own_overhead_offset():
    # Steps at γ = 0 run 3 ms over their calibrated forward, steps at γ = 2 1 ms and at γ = 4 0.5 ms (the
    # calibration overstated how much dearer 5 query tokens are than 1): all are learnt; plain decoding's apart
    # from the speculative steps', untried γ ≥ 1 get the speculative steps' mean.
    cost = synthetic(lambda b, q: 1e-2 * q, lambda b, q: 1e-3)
    for _ in range(100):
        for gamma, extra in ((0, 3e-3), (2, 1e-3), (4, 5e-4)):
            verify, draft = cost.raw_step_time(1, gamma)
            cost.observe(1, gamma, verify + extra + draft, draft_seconds=draft)
    overheads = cost.step_overheads(1, 8)
    assert overheads[0] == pytest.approx(3e-3, rel=0.05)
    assert overheads[2] == pytest.approx(1e-3, rel=0.3) and overheads[4] == pytest.approx(5e-4, rel=0.5)
    assert overheads[4] < overheads[3] < overheads[2] < overheads[0]


def test_plain_steps_keep_their_own_overhead_and_are_timed_where_speculation_runs_on():
    """A speculative step costs 40 ms its calibrated forwards do not time (at a 32k vocabulary: sampling and
    verifying γ + 1 positions), a plain step 1 ms. Pooled into one overhead, plain decoding inherited the 40 ms and
    the policy drafted on at under half plain's speed (the subword long-tail run); kept apart, and plain timed
    every PLAIN_CHECK_EVERY speculative steps, it turns to plain decoding and stays there."""
    cost = synthetic(lambda b, q: 1e-2 + 1e-3 * q, lambda b, q: 1e-4)
    policy = with_acceptance(AutoGamma(cost, max_gamma=4, decay=0.9), 0.5)
    chosen = []
    for _ in range(400):
        gamma = policy.choose(StepShape(1), greedy=True)
        verify, draft = cost.raw_step_time(1, gamma)
        cost.observe(1, gamma, verify + draft + (4e-2 if gamma else 1e-3), draft_seconds=draft)
        chosen.append(gamma)
    assert chosen[0] > 0  # the calibration alone says drafting pays
    assert chosen.index(0) == PLAIN_CHECK_FIRST - 1  # plain timed at the PLAIN_CHECK_FIRST-th step there
    assert chosen[-200:] == [0] * 200
    assert cost.step_overheads(1, 4)[0] == pytest.approx(1e-3) and cost.step_overheads(1, 4)[4] > 3e-2


def test_plain_steps_set_the_prior_of_speculative_ones_where_none_ran():
    cost = synthetic(lambda b, q: 1e-2 * q, lambda b, q: 1e-3)
    for _ in range(10):
        cost.observe(16, 0, cost.raw_step_time(16, 0)[0] + 2e-3)
    assert cost.step_overheads(16, 4) == pytest.approx([2e-3] * 5)
    assert cost.step_overheads(4, 4) == pytest.approx([2e-3] * 5)  # the nearest measured batch size's


def test_rows_near_their_length_limit_cap_the_useful_draft_length():
    # Drafting is cheap but not free; acceptance is 1. With room for every draft the policy drafts
    # max_gamma; when every row has only 2 tokens left, drafts past the first are wasted.
    cost = synthetic(lambda b, q: 1e-2, lambda b, q: 1e-3)
    policy = with_acceptance(AutoGamma(cost, max_gamma=8, decay=0.9), 1.0)
    assert policy.choose(StepShape(4, room=[0] * 8 + [4]), greedy=True) == 8
    assert policy.choose(StepShape(4, room=[0, 4] + [0] * 7), greedy=True) == 1
    # Mixed rooms: expected tokens add up per row, capped at each row's room.
    est = policy.estimates[True]
    assert est.batch_tokens(3, [1, 1, 0, 1])[:4] == pytest.approx([3, 5, 6, 7])


def test_stop_rate_discounts_long_drafts():
    est = AcceptanceEstimate(max_gamma=4, decay=0.0)
    est.update(torch.ones(800, 4, dtype=torch.bool), emitted=4000, stopped=0)
    assert est.expected_tokens(4) == pytest.approx(5.0, abs=0.05)
    # Every 5th token a stop token: a token is used only if none before it ended the row.
    est.update(torch.ones(800, 4, dtype=torch.bool), emitted=10_000, stopped=2_000)
    keep = 1 - 2_000 / (10_000 + 32)
    assert est.expected_tokens(4) == pytest.approx(sum(keep**k for k in range(5)), abs=0.05)


def test_drafts_after_a_rejection_are_weighed_at_their_long_run_share():
    # Rows that just had a draft rejected keep their next first draft half the time; the others
    # always. Under γ = 1 every step is kept or rejected at once; under larger γ more steps start
    # after a rejection. The estimate must follow the state mix, not a pooled per-position rate.
    est = AcceptanceEstimate(max_gamma=4, decay=0.0)
    fresh = torch.ones(1000, 4, dtype=torch.bool)  # from state 0: every draft kept
    hard = torch.zeros(1000, 4, dtype=torch.bool)
    hard[:500] = True  # from state 1: half the rows keep all, half none
    accepted = torch.cat([fresh, hard])
    state = torch.cat([torch.zeros(1000, dtype=torch.bool), torch.ones(1000, dtype=torch.bool)])
    est.update(accepted, after_rejection=state)
    assert est.alpha_by_state[0][0] == pytest.approx(1.0, abs=0.01)
    assert est.alpha_by_state[1][0] == pytest.approx(0.5, abs=0.01)
    # Steps from state 0 never reject, so in the long run every step starts in state 0: γ = 4 gives 5.
    assert est.expected_tokens(4) == pytest.approx(5.0, abs=0.05)
    # Now state-0 rows reject their 3rd draft: a γ ≥ 3 step ends in state 1 and the mix moves.
    fresh[:, 2:] = False
    est.update(torch.cat([fresh, hard]), after_rejection=state)
    s0 = [1, 1, 1, 0, 0]  # survival from state 0
    s1 = [1, 0.5, 0.5, 0.5, 0.5]
    share = s1[4] / (s1[4] + 1 - s0[4])  # 1/3 of steps start in state 0
    assert est.expected_tokens(4) == pytest.approx(sum(share * a + (1 - share) * b for a, b in zip(s0, s1)), abs=0.05)
    assert est.expected_tokens(2) == pytest.approx(3.0, abs=0.05)  # γ = 2 never leaves state 0


def test_choice_sticks_to_the_last_gamma_unless_another_is_clearly_better():
    cost = synthetic(lambda b, q: 1e-2 * (1 + 0.1 * q), lambda b, q: 1e-3)
    policy = with_acceptance(AutoGamma(cost, max_gamma=8, decay=0.9), 0.8)
    shape = StepShape(4)
    rates = policy.rates(shape, greedy=True)
    best = max(range(9), key=rates.__getitem__)
    near = [g for g in range(1, 9) if g != best and rates[g] >= (1 - STICK_WITHIN / 2) * rates[best]]
    far = [g for g in range(1, 9) if rates[g] < (1 - 2 * STICK_WITHIN) * rates[best]]
    assert near and far, rates
    policy.last[True] = near[0]
    assert policy.choose(shape, greedy=True) == near[0]  # within noise of the best: no switch
    policy.last[True] = far[0]
    assert policy.choose(shape, greedy=True) == best


def test_memory_counts_evidence_rows_not_steps():
    # A step of one row decays the counts by decay ** (1 / MEMORY_ROWS), a step of MEMORY_ROWS rows or
    # more by decay: a batch of one keeps about as many rows of evidence as a batch of four.
    small, large = AcceptanceEstimate(max_gamma=1, decay=0.5), AcceptanceEstimate(max_gamma=1, decay=0.5)
    for est, rows in ((small, 1), (large, MEMORY_ROWS)):
        for _ in range(2):
            est.update(torch.ones(rows, 1, dtype=torch.bool))
    assert small.reached[0][0] == pytest.approx(0.5 ** (1 / MEMORY_ROWS) + 1)
    assert large.reached[0][0] == pytest.approx(MEMORY_ROWS * 1.5)


def test_batch_tokens_sum_each_rows_capped_expectation():
    # batch_tokens folds every γ into one pass; it must equal Σ over rows of cumulative(γ)[min(γ, room)].
    est = AcceptanceEstimate(max_gamma=6, decay=0.9)
    gen = torch.Generator().manual_seed(1)
    kept = torch.randint(0, 7, (30,), generator=gen)
    accepted = torch.arange(6) < kept[:, None]
    est.update(accepted, emitted=300, stopped=7, after_rejection=torch.rand(30, generator=gen) < 0.4)
    room = [2, 0, 1, 3, 0, 1, 5]
    rows = sum(room)
    by_row = [m for m, count in enumerate(room) for _ in range(count)]
    for gamma, total in enumerate(est.batch_tokens(rows, room)):
        curve = est.cumulative(gamma)
        assert total == pytest.approx(sum(curve[min(gamma, m)] for m in by_row))
    assert est.batch_tokens(rows, None) == pytest.approx([rows * est.expected_tokens(g) for g in range(7)])


def test_break_even_acceptance_is_where_the_first_gamma_pays():
    from specroll.rollout.gamma.break_even import break_even_acceptance

    assert break_even_acceptance([10.0, 12.0, 14.0, 16.0]) == pytest.approx(0.2, abs=1e-6)  # 1 + α = 1.2
    assert break_even_acceptance([10.0, 20.0, 30.0]) == 1.0  # no γ can ever pay at these costs
    # γ = 2 at 1.5× the plain step pays once 1 + α + α² > 1.5, before γ = 1 (at 1.4×) does (α > 0.4).
    assert break_even_acceptance([10.0, 14.0, 15.0]) == pytest.approx(((1 + 4 * 0.5) ** 0.5 - 1) / 2, abs=1e-6)
