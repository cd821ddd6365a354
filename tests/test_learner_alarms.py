"""A learner that stops learning is loud: its alarms, unit by unit, and a forced stall through `specroll train`."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml
from train_runs import REPO, run_train

from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.gate.alarms import LearnerAlarms
from specroll.online_drafter.reports import LearnerReport, ProbeReport


def round_report(steps: int = 5, published: bool = False, budget_s: float | None = 2.0) -> LearnerReport:
    nan = math.nan
    return LearnerReport(published=published, version=0, acceptance_before=nan, acceptance_after=nan,
                         acceptance_frozen_shadow=nan, gain=nan, gain_se=nan, loss=nan, train_time_s=0.1 * steps,
                         eval_time_s=0.0, round_time_s=0.2, budget_s=budget_s, num_positions=100 * steps,
                         num_steps=steps, num_holdout_positions=50, num_holdout_groups=4, policy_version=1)


def probe_report(frozen: float, frozen_se: float = 0.01, time_s: float = 0.1, version: int = 0) -> ProbeReport:
    return ProbeReport(served=frozen, frozen=frozen, gain=0.0, gain_se=0.005, served_se=frozen_se,
                       frozen_se=frozen_se, num_positions=500, num_groups=32, policy_version=version,
                       drafter_version=0, time_s=time_s)


def test_too_few_steps_over_the_window_raise_one_stall_alarm_with_the_numbers():
    alarms = LearnerAlarms(LearnerConfig(alarm_rounds=3, alarm_min_steps=3))
    assert alarms.after_round(round_report(steps=1), step_s=0.4) == ()
    assert alarms.after_round(round_report(steps=0), step_s=0.4) == ()  # the window is not full yet
    (raised,) = alarms.after_round(round_report(steps=1, budget_s=0.05), step_s=0.4)
    assert raised.startswith("learner stalled: 2 optimizer steps in the last 3 rounds")
    assert "0.05" in raised and "one optimizer step takes 0.400 s" in raised
    assert alarms.active == 1
    assert alarms.after_round(round_report(steps=0), step_s=0.4) == ()  # still stalled: raised once
    for _ in range(3):
        alarms.after_round(round_report(steps=5), step_s=0.4)
    assert alarms.active == 0  # cleared: a later stall is raised again
    alarms.after_round(round_report(steps=0), step_s=0.4)
    alarms.after_round(round_report(steps=0), step_s=0.4)
    assert len(alarms.after_round(round_report(steps=0), step_s=0.4)) == 1


def test_nothing_published_while_the_frozen_drafter_falls_is_an_alarm():
    alarms = LearnerAlarms(LearnerConfig(alarm_publish_rounds=3))
    alarms.after_probe(probe_report(0.90))
    alarms.after_round(round_report(published=True), step_s=0.1)
    alarms.after_probe(probe_report(0.80, version=5))  # fell 0.10, far beyond 1.64 standard errors
    assert alarms.after_round(round_report(), step_s=0.1) == ()
    assert alarms.after_round(round_report(), step_s=0.1) == ()
    (raised,) = alarms.after_round(round_report(), step_s=0.1)
    assert raised.startswith("learner publishes nothing: no drafter version in the last 3 rounds")
    assert alarms.after_round(round_report(published=True), step_s=0.1) == () and alarms.active == 0


def test_no_publish_alarm_while_the_frozen_drafter_holds():
    alarms = LearnerAlarms(LearnerConfig(alarm_publish_rounds=2))
    alarms.after_probe(probe_report(0.90))
    alarms.after_probe(probe_report(0.89, frozen_se=0.01, version=5))  # within its interval
    assert [alarms.after_round(round_report(), step_s=0.1) for _ in range(4)] == [()] * 4


def test_probe_scoring_longer_than_the_mean_round_budget_since_the_last_probe_is_an_alarm():
    alarms = LearnerAlarms(LearnerConfig())
    alarms.after_probe(probe_report(0.9, time_s=0.5))
    assert alarms.after_round(round_report(budget_s=1.0), step_s=0.1) == ()
    for budget in (2.0, 2.0, 2.0):
        alarms.after_round(round_report(budget_s=budget), step_s=0.1)
    alarms.after_probe(probe_report(0.9, time_s=1.2))
    # the run's last round may get only what earlier rounds left: judged on the mean since the last probe
    assert alarms.after_round(round_report(budget_s=0.2), step_s=0.1) == ()
    alarms.after_probe(probe_report(0.9, time_s=3.0))
    (raised,) = alarms.after_round(round_report(budget_s=1.0), step_s=0.1)
    assert raised.startswith("probe scoring took 3.00 s, longer than the mean budget of the learner rounds since "
                             "the probe before it (0.60 s over 2 rounds)")
    assert alarms.after_round(round_report(budget_s=1.0), step_s=0.1) == ()  # judged once, with its round


@pytest.mark.parametrize("field, value", [("alarm_rounds", 0), ("alarm_min_steps", -1), ("alarm_publish_rounds", 0)])
def test_bad_alarm_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=f"{field}={value}"):
        LearnerConfig(**{field: value})


@pytest.fixture(scope="module")
def stalled_run(tmp_path_factory, tiny_demo_cache):
    """The tiny main job with a learner budget too small for one optimizer step, alarming over K = 2 rounds."""
    pytest.importorskip("trl")
    pytest.importorskip("ray")
    config = yaml.safe_load((REPO / "configs" / "demo_tiny.yaml").read_text())
    config["learner"].update(time_budget_s=1e-6, alarm_rounds=2, alarm_min_steps=1)
    config["grpo"]["steps"] = 3  # the second round's alarm is logged with the third step's metrics
    path = tmp_path_factory.mktemp("config") / "stalled.yaml"
    path.write_text(yaml.safe_dump(config))
    return run_train(path, tmp_path_factory.mktemp("report"), tiny_demo_cache, tmp_path_factory.mktemp("logs"))


def test_a_stalled_learner_is_an_event_a_warning_and_a_metric_within_k_rounds(stalled_run):
    assert stalled_run.returncode == 0, stalled_run.stderr[-4000:]
    # each on a line of its own (`tqdm.write`); another process's progress bar may still end in the same line
    warnings = ["specroll: WARNING:" + line.split("specroll: WARNING:", 1)[1]
                for line in stalled_run.stderr.splitlines() if "specroll: WARNING:" in line]
    stalls = [line for line in warnings if "learner stalled" in line]
    # raised at the second round (K = 2), printed once though the stall goes on in the third
    # the seconds spent finding the deadline passed are the machine's (0.03 s on a loaded one): any two decimals
    assert len(stalls) == 1 and re.fullmatch(
        r"specroll: WARNING: round after step 1: learner stalled: 0 optimizer steps in the last 2 rounds \(alarm "
        r"below 1\); round budgets 0\.00 / 0\.00 s, \d+\.\d\d s spent training; no optimizer step measured yet\. "
        r"Too small a budget \(learner_schedule, learner\.time_budget_s\) or an oversubscribed CPU \(torch threads "
        r"per process are in the report\)", stalls[0]), warnings
    summary = json.loads((stalled_run.out / "summary.json").read_text())
    alarms = summary["headline"]["alarms"]
    assert [a for a in alarms if "learner stalled" in a] == [stalls[0].removeprefix("specroll: WARNING: ")]
    # the probe's scoring (a few ms) also outlasts a 1 µs round budget: alarmed too
    assert all("learner stalled" in a or "probe scoring took" in a for a in alarms), alarms
    steps = [json.loads(line) for line in (stalled_run.out / "metrics.jsonl").read_text().splitlines()]
    assert [e["drafter/alarms"] for e in steps if "drafter/alarms" in e][-1] == 1.0
    page = (stalled_run.out / "report.html").read_text()
    assert page.index("ALARM") < page.index("<table>")  # listed at the top
    assert summary["headline"]["verdict"].startswith("WARNING") or not summary["headline"].get("helped")
