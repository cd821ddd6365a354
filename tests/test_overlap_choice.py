"""`gamma.overlap_choice.OverlapChoice` (engine.overlap: "auto") from injected step times — never the wall clock — and
how the engine's speculation part routes a step that drafted ahead (`EngineSpeculation.observe`)."""

from __future__ import annotations

from specroll.rollout.config import EngineConfig
from specroll.rollout.core.stats import EngineStats, StepSummary
from specroll.rollout.engine_speculation import EngineSpeculation, StepPlan, StepReport
from specroll.rollout.gamma.overlap_choice import MEASURE_FIRST, RETRY_EVERY, OverlapChoice
from specroll.rollout.gamma.policy import StepShape


def run(choice: OverlapChoice, rows: int, steps: int, seconds: dict[bool, float], emitted: int = 8) -> list[bool]:
    """`steps` steps at `rows` rows, each kind taking its injected seconds; the choices made."""
    chosen = []
    for _ in range(steps):
        overlapped = choice.choose(rows)
        choice.observe(rows, overlapped, emitted, seconds[overlapped])
        chosen.append(overlapped)
    return chosen


def test_auto_measures_both_then_overlaps_where_it_pays():
    choice = OverlapChoice("auto")
    chosen = run(choice, 4, 2 * MEASURE_FIRST + 20, {True: 0.010, False: 0.014})
    assert chosen[: 2 * MEASURE_FIRST].count(True) == MEASURE_FIRST  # both kinds measured first
    assert all(chosen[2 * MEASURE_FIRST:])
    assert choice.rate(4, True) == 800.0 and choice.rate(3, False) == 8 / 0.014  # 3 and 4 rows share a bucket


def test_auto_refuses_overlap_where_it_does_not_pay_and_retries_it():
    choice = OverlapChoice("auto")
    chosen = run(choice, 16, 2 * MEASURE_FIRST + 2 * RETRY_EVERY, {True: 0.030, False: 0.020})
    after = chosen[2 * MEASURE_FIRST:]
    assert after.count(True) == 2  # only the retries, one every RETRY_EVERY steps
    assert after[RETRY_EVERY - 1] and after[2 * RETRY_EVERY - 1]


def test_auto_chooses_per_batch_size():
    choice = OverlapChoice("auto")
    run(choice, 1, 2 * MEASURE_FIRST, {True: 0.005, False: 0.008})
    run(choice, 16, 2 * MEASURE_FIRST, {True: 0.040, False: 0.030})
    assert choice.choose(1) and not choice.choose(16)
    assert choice.choose(6) is True  # 5–8 rows: a bucket not measured yet (drafting ahead is measured first)


def test_fixed_settings_ignore_times():
    for setting in (True, False):
        choice = OverlapChoice(setting)
        assert run(choice, 4, 5, {True: 1.0, False: 0.001}) == [setting] * 5
        assert choice.rates == {}


class Recording:
    """A γ policy that records what it is shown."""

    adaptive = True

    def __init__(self):
        self.seen = []

    def choose(self, shape, greedy):
        return 3

    def observe(self, shape, outcome, greedy):
        self.seen.append(outcome)


def test_a_step_drafted_ahead_teaches_acceptance_not_step_time():
    """Auto-γ's cost model is one of serial steps: a step that drafted ahead reaches it as a catch-up step (acceptance
    counted, time not), while the overlap choice learns its time."""
    policy = Recording()
    speculation = EngineSpeculation(EngineConfig(overlap="auto"), object(), EngineStats(), None, policy, None)
    plans = [speculation.plan(StepShape(4), True, True) for _ in range(2)]
    assert [plan.overlap for plan in plans] == [True, True]  # nothing measured: drafting ahead first
    summary = StepSummary(finished=[], emitted=8, stopped=0, dropped_rows=0, kept_per_position=[4, 3, 1],
                          drafted_per_position=[4, 4, 4], by_drafter={}, counts=[[4, 3, 1]] * 4)
    for overlapped in (True, False):
        speculation.drafter_behind = False
        plan = StepPlan(StepShape(4), 3, overlap=overlapped)
        speculation.observe(StepReport(plan, 3, summary, None, 0.01, None), greedy=True)
    assert [outcome.catch_up for outcome in policy.seen] == [True, False]
    assert speculation.overlap.steps == {(3, True): 1, (3, False): 1}
