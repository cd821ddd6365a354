"""LearnerAlarms: the online learner says so when it stops learning, instead of failing silently.

    alarms = LearnerAlarms(config)                      # the learner owns one
    raised = alarms.after_round(report, step_s)         # new alarm messages of this round (usually none)
    alarms.after_probe(probe)                           # probes feed the drift and probe-time checks

A learner that trains nothing looks like a healthy run: rollouts go on, the drafter stays as it was and
acceptance slowly falls as the policy moves. Seen on the demo with `OMP_NUM_THREADS=2` inherited by
every actor (oversubscribed cores): 0–1 optimizer steps per round, probe scoring 20x slower, one version
in 20 steps, online − frozen 0.00 at the end — and nothing said so. Three conditions are alarms:

- **stalled**: fewer than `alarm_min_steps` optimizer steps over the last `alarm_rounds` rounds (the
  budget may be too small for a step, or the process too slow: the message gives steps, budgets and
  the time one step takes);
- **publishes nothing**: no version published in the last `alarm_publish_rounds` rounds while the
  probe shows the frozen drafter falling (its last probe below its first by more than `gate_z`
  standard errors): there is drift to win back and none is won;
- **probe slower than the rounds**: the learner's scoring of a probe took longer than the mean budget of
  the rounds since the probe before it (this one's included): it measures more than it learns. The mean,
  not the last round's: the schedule's budget is cumulative, so one round (the run's last, often) may get
  only what earlier rounds left.

Each alarm is raised when its condition starts to hold, once, and again only after it cleared; while
any holds, `active` counts them. The learner puts both in its `LearnerReport` (`alarms`,
`alarms_active`); the TRL hook's schedule records them as events, prints each once and logs
`drafter/alarms`; the Ray learner actor exports them to Prometheus; the run's report lists them first.
"""

from __future__ import annotations

import math
from collections import deque

from ..learner_config import LearnerConfig
from ..reports import LearnerReport, ProbeReport


class LearnerAlarms:
    def __init__(self, config: LearnerConfig):
        self.config = config
        self.recent: deque[LearnerReport] = deque(maxlen=config.alarm_rounds)
        self.rounds_since_publish = 0
        self.first_probe: ProbeReport | None = None
        self.last_probe: ProbeReport | None = None
        self.unjudged_probe: ProbeReport | None = None  # its scoring time awaits the next round's budget
        self.budgets_since_probe: list[float] = []  # the budgets of the rounds since the last probe
        self.probe_window: list[float] = []  # those before the unjudged probe: its scoring time is judged on them
        self.holding: set[str] = set()

    @property
    def active(self) -> int:
        return len(self.holding)

    def after_probe(self, probe: ProbeReport) -> None:
        if self.first_probe is None:
            self.first_probe = probe
        self.last_probe = probe
        self.unjudged_probe = probe
        self.probe_window, self.budgets_since_probe = self.budgets_since_probe, []

    def after_round(self, report: LearnerReport, step_s: float) -> tuple[str, ...]:
        """The alarms this round raises (`step_s`: the learner's last measured optimizer step, 0 if none)."""
        self.recent.append(report)
        self.rounds_since_publish = 0 if report.published else self.rounds_since_publish + 1
        if report.budget_s is not None:
            self.budgets_since_probe.append(report.budget_s)
        found = {"stalled": self._stalled(step_s), "publishes nothing": self._publishes_nothing(),
                 "probe slower than the rounds": self._slow_probe()}
        self.unjudged_probe = None
        raised = tuple(message for kind, message in found.items() if message and kind not in self.holding)
        self.holding = {kind for kind, message in found.items() if message}
        return raised

    def _stalled(self, step_s: float) -> str | None:
        cfg = self.config
        if len(self.recent) < cfg.alarm_rounds:
            return None
        steps = sum(r.num_steps for r in self.recent)
        if steps >= cfg.alarm_min_steps:
            return None
        budgets = " / ".join("none" if r.budget_s is None else f"{r.budget_s:.2f}" for r in self.recent)
        trained = sum(r.train_time_s for r in self.recent)
        step = f"one optimizer step takes {step_s:.3f} s" if step_s > 0 else "no optimizer step measured yet"
        return (f"learner stalled: {steps} optimizer steps in the last {cfg.alarm_rounds} rounds (alarm below "
                f"{cfg.alarm_min_steps}); round budgets {budgets} s, {trained:.2f} s spent training; {step}. "
                "Too small a budget (learner_schedule, learner.time_budget_s) or an oversubscribed CPU "
                "(torch threads per process are in the report)")

    def _publishes_nothing(self) -> str | None:
        first, last = self.first_probe, self.last_probe
        if self.rounds_since_publish < self.config.alarm_publish_rounds or first is None or last is first:
            return None
        drop = first.frozen - last.frozen
        if drop <= self.config.gate_z * math.hypot(first.frozen_se, last.frozen_se):
            return None
        return (f"learner publishes nothing: no drafter version in the last {self.rounds_since_publish} rounds "
                f"while the frozen drafter fell {drop:.3f} on the probe ({first.frozen:.3f} at policy version "
                f"{first.policy_version} → {last.frozen:.3f} at {last.policy_version}); the served drafter is "
                f"{last.gain:+.3f} ± {last.gain_se:.3f} over the frozen one")

    def _slow_probe(self) -> str | None:
        probe, budgets = self.unjudged_probe, self.probe_window + self.budgets_since_probe[-1:]
        if probe is None or not budgets or probe.time_s <= sum(budgets) / len(budgets):
            return None
        return (f"probe scoring took {probe.time_s:.2f} s, longer than the mean budget of the learner rounds "
                f"since the probe before it ({sum(budgets) / len(budgets):.2f} s over {len(budgets)} rounds): "
                "it measures more than it learns")
