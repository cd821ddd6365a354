"""The pieces every γ policy stands on: the calibrated cost model's interpolation, the host tally of
acceptance counts and the break-even acceptance (the policy itself: test_gamma_rate.py; inside the
engine: test_gamma_engine.py)."""

from __future__ import annotations

import pytest
import torch

from specroll.rollout.break_even import break_even_acceptance
from specroll.rollout.cost_model import CostModel, ForwardTimes
from specroll.rollout.gamma import acceptance_counts
from specroll.rollout.gamma_rate import RateGamma

BATCHES = [1, 4, 16, 64]


def test_long_contexts_interpolate_the_verification_cost():
    queries = [1, 2, 3, 5, 9]
    times = lambda f: ForwardTimes(BATCHES, queries, [[f(b, q) for q in queries] for b in BATCHES])
    drafter = ForwardTimes(BATCHES, [1, 2], [[1e-3] * 2 for _ in BATCHES])
    cost = CostModel(target=times(lambda b, q: 1e-2), drafter=drafter,
                     target_long=times(lambda b, q: 1e-2 + 2e-2 * b * q), contexts=(64, 512))
    assert cost.target_time(4, 3, context=64) == pytest.approx(1e-2)
    assert cost.target_time(4, 3, context=288) == pytest.approx(1e-2 + 0.5 * 2e-2 * 12)


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
    policy = RateGamma(cost, max_gamma=8, decay=0.9)
    for rows in (1, 3, 16):
        for context in (10, 64, 300, 700):
            verify, draft = policy.calibrated_times(rows, context)
            assert verify == pytest.approx([cost.target_time(rows, g + 1, context) for g in range(9)])
            assert draft == pytest.approx([cost.draft_time(rows, g) for g in range(9)])


def test_host_tally_matches_counting_every_draft():
    # The engine hands the policy per-row integers (kept prefix, decided prefix); the tally must equal
    # counting each draft position of each row by hand.
    gen = torch.Generator().manual_seed(0)
    for gamma in (1, 3, 6):
        n = 40
        kept = torch.randint(0, gamma + 1, (n,), generator=gen)
        decided = torch.randint(1, gamma + 2, (n,), generator=gen)  # num_emit: 1 … γ + 1
        j = torch.arange(gamma)
        reached = (j <= kept[:, None]) & (j < decided[:, None])
        accepted = (j < kept[:, None]) & (j < decided[:, None])
        expect = [reached.sum(0).tolist(), accepted.sum(0).tolist()]
        assert acceptance_counts(kept.tolist(), decided.tolist(), gamma) == expect


def test_drafts_past_a_rows_end_are_no_evidence():
    # Every draft matched the target, but the rows stopped after 2 tokens: positions 3 and 4 are not counted.
    assert acceptance_counts([4] * 8, [2] * 8, 4) == [[8, 8, 0, 0], [8, 8, 0, 0]]


def test_break_even_acceptance_is_where_the_first_gamma_pays():
    assert break_even_acceptance([10.0, 12.0, 14.0, 16.0]) == pytest.approx(0.2, abs=1e-6)  # 1 + α = 1.2
    assert break_even_acceptance([10.0, 20.0, 30.0]) == 1.0  # no γ can ever pay at these costs
    # γ = 2 at 1.5× the plain step pays once 1 + α + α² > 1.5, before γ = 1 (at 1.4×) does (α > 0.4).
    assert break_even_acceptance([10.0, 14.0, 15.0]) == pytest.approx(((1 + 4 * 0.5) ** 0.5 - 1) / 2, abs=1e-6)
