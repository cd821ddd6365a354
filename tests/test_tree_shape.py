"""The tree shape per step (`gamma.tree`): chains where a wider verification costs more than it keeps (a full
batch), trees where it is nearly free (the drained tail), a fixed width for benchmarks, and what a tree step teaches."""

from __future__ import annotations

from gamma_helpers import with_acceptance

from specroll.rollout.gamma.auto import AutoGamma
from specroll.rollout.gamma.cost_model import CostModel
from specroll.rollout.gamma.policy import StepShape
from specroll.rollout.gamma.tree_shape import EXPLORE_EVERY, AutoWidth, FixedWidth
from specroll.rollout.models.timing import ForwardTimes

BATCHES, QUERIES = [1, 4, 16], [1, 2, 3, 5, 9, 17, 33]


def cost_model() -> CostModel:
    """A target whose forward costs 10 ms at every query length for 1 row (the tail) and grows 2 ms per token per
    row at 16 rows (a full batch); drafts 1 ms per row-token."""
    def target(b, q):
        return 0.010 + (0.002 * (q - 1) * b / 16 if b > 4 else 0.0)

    targets = ForwardTimes(BATCHES, QUERIES, [[target(b, q) for q in QUERIES] for b in BATCHES])
    drafts = ForwardTimes(BATCHES, [1, 2], [[0.001 + 0.0001 * (b * q - 1) for q in (1, 2)] for b in BATCHES])
    return CostModel(target=targets, drafter=drafts)


def policy(alpha: float) -> AutoWidth:
    auto = with_acceptance(AutoGamma(cost_model(), max_gamma=4, decay=0.9), alpha)
    return AutoWidth(auto, max_width=4, decay=0.9)


def test_trees_in_the_tail_chains_at_full_batch():
    shapes = policy(0.6)
    depth, width = shapes.choose(StepShape(1), 4, greedy=False)
    assert width > 1 and depth >= 1
    assert shapes.choose(StepShape(16), 2, greedy=False) == (2, 1)


def test_no_tree_without_a_chain_to_grow():
    assert policy(0.6).choose(StepShape(1), 0, greedy=False) == (0, 1)
    assert FixedWidth(3).choose(StepShape(1), 0, greedy=True) == (0, 1)
    assert FixedWidth(3).choose(StepShape(16), 4, greedy=True) == (4, 3)


def test_a_tree_that_ran_slower_than_predicted_is_judged_on_its_measured_time():
    shapes, shape = policy(0.6), StepShape(1)
    depth, width = shapes.choose(shape, 4, greedy=False)
    assert width > 1  # predicted to win before any tree ran: probed once
    shapes.observe(shape, depth, width, [depth], [depth], 10 * shapes.step_time(shape, depth, width), greedy=False)
    later = shapes.choose(shape, 4, greedy=False)
    assert later[1] != width or later == (4, 1), later  # that width is judged slow now; another may be probed


def test_measured_tree_acceptance_moves_the_choice():
    shapes = policy(0.6)
    assert shapes.choose(StepShape(1), 4, greedy=False)[1] > 1
    for _ in range(200):  # width-w trees never keep anything: evidence against every width
        for width in range(2, 5):
            shapes.observe(StepShape(1), 4, width, [0], [1], 0.012, greedy=False)
    chosen = [shapes.choose(StepShape(1), 4, greedy=False) for _ in range(EXPLORE_EVERY - 1)]
    assert all(width == 1 for _, width in chosen)


def test_expected_tokens_grow_with_width_before_any_tree_ran():
    shapes = policy(0.5)
    tokens = [shapes.expected_tokens(4, w, greedy=True) for w in (2, 3, 4)]
    assert tokens == sorted(tokens) and tokens[0] > shapes.auto.estimates[True].expected_tokens(4) - 1e-9


def test_the_first_step_of_a_mode_is_a_chain_and_trees_that_win_still_let_the_chain_run():
    fresh = AutoWidth(AutoGamma(cost_model(), max_gamma=4, decay=0.9), max_width=4, decay=0.9)
    assert fresh.choose(StepShape(1), 4, greedy=False) == (4, 1)  # no α measured yet: auto-γ's chain measures it
    shapes, shape, chosen = policy(0.6), StepShape(1), []
    for _ in range(2 * EXPLORE_EVERY + 1):  # every tree run as predicted, every node kept: trees keep winning
        depth, width = shapes.choose(shape, 4, greedy=False)
        chosen.append(width)
        if width > 1:
            shapes.observe(shape, depth, width, [depth], [depth], shapes.step_time(shape, depth, width), greedy=False)
    assert chosen[0] > 1 and chosen.count(1) == 2, chosen  # the first tree probes its width; then 1 chain in 32


def test_a_calibration_taken_on_a_busy_machine_does_not_keep_trees_where_they_lose():
    """Every calibrated time 5x the true one (a calibration on a loaded machine), at a full batch where the true
    times make trees lose: each side's prediction is corrected from its own steps, so the chain must run to be
    corrected. With trees only, the trees' offset corrected their prediction and the chain's stayed 5x: trees won
    every step (as measured on the demo models: 88% of full-batch steps, 0.59x the chains)."""
    from specroll.rollout.gamma.policy import StepOutcome

    true = cost_model()
    scaled = ForwardTimes(true.target.batch_sizes, true.target.query_lens,
                          [[5 * t for t in row] for row in true.target.times])
    drafts = ForwardTimes(true.drafter.batch_sizes, true.drafter.query_lens,
                          [[5 * t for t in row] for row in true.drafter.times])
    auto = AutoGamma(CostModel(target=scaled, drafter=drafts), max_gamma=4, decay=0.9)
    shapes = AutoWidth(auto, max_width=4, decay=0.9)
    truth = AutoWidth(with_acceptance(AutoGamma(true, max_gamma=4, decay=0.9), 0.6), max_width=4, decay=0.9)
    rows, alpha, widths = 16, 0.6, []
    for _ in range(4 * EXPLORE_EVERY):
        shape = StepShape(rows)
        gamma = auto.choose(shape, greedy=False)
        depth, width = shapes.choose(shape, gamma, greedy=False)
        widths.append(width)
        if width > 1:  # kept depth as the chain's acceptance gives it; the true time
            kept = [sum(alpha ** (j + 1) >= (r + 0.5) / rows for j in range(depth)) for r in range(rows)]
            shapes.observe(shape, depth, width, kept, [min(k + 1, depth) for k in kept],
                           truth.step_time(shape, depth, width), greedy=False)
        else:
            reached = [round(rows * alpha ** j) for j in range(gamma)]
            kept = [round(rows * alpha ** (j + 1)) for j in range(gamma)]
            counts = [reached, kept, [0] * gamma, [0] * gamma]
            verify, draft = true.raw_step_time(rows, gamma)
            auto.observe(shape, StepOutcome(gamma, rows, counts, emitted=rows + sum(kept), stopped=0,
                                            seconds=verify + draft, draft_seconds=draft), greedy=False)
    late = widths[EXPLORE_EVERY:]
    assert late.count(1) >= 0.9 * len(late), widths
