"""LearnerSchedule: when the TRL hook runs online draft learning, with what budget, and what it logs.

The hook starts a background round right after a training batch's rollouts (the backend returns at
once) and collects it at the next call, before the policy sync: the round runs while the trainer
computes rewards and updates the policy, when rollout workers would sit idle. Its budget is the time
it has, bounded by a share of the rollout it is meant to speed up, counted over the whole run:

    budget = min(rollout_share × rollout seconds so far − round seconds so far,
                 update_share × the update's predicted seconds)

The update the round overlaps trains on the batch just rolled out, and its length follows that batch's tokens
(the demo's: 9–47 s a step as completions shrink and grow), so it is predicted as the last update's seconds per
rollout token times this batch's tokens (with no token counts: the last update's seconds; the update's length is
only known from the second step on). Sized on the last update alone, a round after a long update overran the
next short one and the trainer waited for it. A cold start (`speculation_events`: the engine drafts
only once a version's held-out acceptance passes break-even) is the exception while its rollouts decode plainly:
then a round may take up to `COLD_UPDATE_FACTOR` x the predicted update, and the hook stops it when it collects the
round (`finish_learner_round(stop=True)`): the round ends with the update, however long that turned out
(`cold_uses_update`; measured before the stop: rounds sized at 0.9 x the prediction made the trainer wait 79-87 s
of a 540 s run, 15%, for updates shorter than predicted). The rollouts pay nothing for
it — rounds run in the update, while the worker idles — and a head from nothing needs minutes of training where
a quarter of the char world's 2–6 s rollouts gives it about a second a step (measured: a fresh EAGLE head went
0.07 → 0.25 held out in 20 steps, never near break-even). Those rounds' seconds are counted apart
(`LearnerTimes.cold_round_s`), not against the share. Counting the share cumulatively lets a
round use what earlier rounds left (a round that stopped early, one that only scored), so the
learner's total stays at `rollout_share` of the rollout time without each round being cut to the
last, possibly short, rollout's share. Every `ProbeSet.every` steps the round
first scores the served drafter against the frozen one on fresh rollouts of fixed probe prompts
(`DraftLearner.probe`): the drift measure the report plots.

Whether the step's training rollouts drafted at all is logged too (`drafter/speculating`, and their draft
forwards, `drafter/draft_forwards`): with `speculation_events` (a cold start, `EngineConfig.speculation =
"when_learned"`) each turn of it, on or off, is an event, with the drafter version and the acceptance behind it.

The learner's alarms (`online_drafter.gate.alarms`: it stopped learning) are events too, printed to stderr
as they are raised and counted in `drafter/alarms` (alarm conditions holding after each round).

Logged under `drafter/*` into the trainer's metrics (so every `report_to` target sees them), the same
on every backend because they are computed here from the learner's own reports. The schedule also
keeps, for the end-of-run report, every probe (with the policy version it probed, and the served drafter's
per-group scores: two runs' drafters compare paired on them, `tools.probe_compare`), every learner
event, and the time totals behind the learner's share of the critical path.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from specroll.rollout import SamplingParams
from specroll.rollout.core.stats import BatchStats

from .backend import LearnerRound, ProbeRequest

logger = logging.getLogger(__name__)

COLD_UPDATE_FACTOR = 2.0  # a cold round's budget, x the predicted update (the collection stops it earlier)
REPORT_FIELDS = ("loss", "acceptance_before", "acceptance_after", "acceptance_frozen_shadow", "gain", "gain_se",
                 "train_time_s", "round_time_s", "num_steps", "num_holdout_groups", "gated")
# ProbeReport field -> logged name (the served drafter is "online": the one online learning produced)
PROBE_FIELDS = {"served": "online", "frozen": "frozen", "gain": "gain", "gain_se": "gain_se",
                "served_se": "online_se", "frozen_se": "frozen_se"}


@dataclass
class ProbeSet:
    """Fixed prompts in the dataset's format (strings or conversations), never trained on, probed with
    `samples` fresh samples each every `every` steps (and at the first and the last step)."""

    prompts: list[Any]
    every: int = 5
    samples: int = 2

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("prompts=[] is invalid: a probe set needs at least 2 prompts")
        if not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"every={self.every!r} is invalid: an int >= 1")
        if not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"samples={self.samples!r} is invalid: an int >= 1")


@dataclass
class LearnerTimes:
    """Seconds summed over the run: what the learner cost the critical path, and what it ran in all."""

    wait_s: float = 0.0  # the hook blocked on a round (its serial share)
    round_s: float = 0.0  # rounds ran, in the background
    cold_round_s: float = 0.0  # rounds of a cold start while its rollouts decoded plainly (not under the share)
    probe_s: float = 0.0  # the learner's probe scoring, in the background (a measurement, not learning)
    rollout_s: float = 0.0  # training rollouts
    wall_s: float = 0.0  # from the first training rollout to the last collection

    def shares(self) -> dict[str, float]:
        return {"learner_serial_share": self.wait_s / self.wall_s if self.wall_s else 0.0,
                "learner_time_vs_rollout": self.round_s / self.rollout_s if self.rollout_s else 0.0}


@dataclass
class LearnerSchedule:
    probe: ProbeSet | None = None
    rollout_share: float = 0.25
    update_share: float = 0.9
    max_budget_s: float | None = None
    speculation_events: bool = False
    cold_uses_update: bool = True
    probes: list[dict[str, float]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    times: LearnerTimes = field(default_factory=LearnerTimes)
    _started_at: float | None = None
    _first_rollout_at: float | None = None
    _update_s: float | None = None  # from a round's start to its collection: the trainer's update
    _update_tokens: int | None = None  # the rollout tokens of the batch that update trained on
    _batch_tokens: int | None = None  # the rollout tokens of the batch the next round's update trains on
    _pending_probe: int | None = None  # the policy version of the probe in flight
    num_rounds: int = 0
    num_published: int = 0  # rounds that published a drafter version (the gate's or the watchdog's)
    _speculating: bool | None = None  # whether the last training step's rollouts drafted
    _last_acceptance: float | None = None  # the last gated round's held-out acceptance of the served drafter
    _round_cold: bool = False  # the round in flight was budgeted as a cold start's (`cold`)
    _round_tokens: int | None = None  # the rollout tokens of the batch whose update the round in flight overlaps

    def predicted_update_s(self) -> float | None:
        """Seconds the update the next round overlaps should take (module docstring); None before the first."""
        if self._update_s is None:
            return None
        if self._update_tokens and self._batch_tokens:
            return self._update_s * self._batch_tokens / self._update_tokens
        return self._update_s

    @property
    def cold(self) -> bool:
        """A cold start whose last training rollouts decoded plainly, with the update's length known: the next
        round is bounded by the update alone (module docstring)."""
        return (self.speculation_events and self.cold_uses_update and self._speculating is False
                and self._update_s is not None)

    def budget(self) -> float:
        """Seconds the next round may take (see the module docstring)."""
        update_s = self.predicted_update_s()
        if self.cold:  # the update's length varies 2x a step: the collection's stop, not the prediction, ends it
            budget = COLD_UPDATE_FACTOR * update_s
        else:
            budget = max(0.0, self.rollout_share * self.times.rollout_s - self.times.round_s)
            if update_s is not None:
                budget = min(budget, self.update_share * update_s)
        return budget if self.max_budget_s is None else min(budget, self.max_budget_s)

    def rollout_done(self, rollout_s: float, started_at: float, tokens: int | None = None) -> None:
        """A training batch's rollouts took `rollout_s` and generated `tokens` (None: not counted)."""
        self.times.rollout_s += rollout_s
        self._batch_tokens = tokens or None
        if self._first_rollout_at is None:
            self._first_rollout_at = started_at

    def speculation_seen(self, step: int, stats: BatchStats, drafter_version: float | None = None) -> dict[str, float]:
        """The metrics of whether step `step`'s training rollouts (`stats`) drafted; with `speculation_events`, an
        event when that turned since the previous step."""
        on = stats.spec_row_steps > 0
        if self.speculation_events and self._speculating is not None and on != self._speculating:
            version = "" if drafter_version is None else f" with drafter version {drafter_version:g}"
            seen = "" if self._last_acceptance is None else f" (its held-out acceptance {self._last_acceptance:.3f})"
            self.events.append(f"step {step}: speculation turned {'on' if on else 'off'}{version}{seen}")
        self._speculating = on
        return {"drafter/speculating": float(on), "drafter/draft_forwards": float(stats.drafter_forwards)}

    def probe_request(self, step: int, prompt_ids: list[list[int]] | None, params: SamplingParams,
                      last_step: int | None = None) -> ProbeRequest | None:
        """The probe to run with this step's round, if one is due — every `every` steps and at the run's
        `last_step` (`prompt_ids`: the probe prompts tokenized)."""
        if self.probe is None or (step % self.probe.every and step != last_step):
            return None
        self._pending_probe = step
        return ProbeRequest(prompt_ids, SamplingParams(**{**asdict(params), "seed": 7_919 * (step + 1)}),
                            self.probe.samples)

    def round_started(self) -> None:
        self._started_at = time.perf_counter()
        self._round_cold = self.cold
        self._round_tokens = self._batch_tokens  # the batch whose update this round overlaps

    def round_collected(self, done: LearnerRound | None) -> dict[str, float]:
        """Account for a collected round; returns the metrics to log (empty when nothing ran)."""
        now = time.perf_counter()
        self._update_s = now - self._started_at if self._started_at is not None else None
        self._update_tokens = self._round_tokens
        if done is None:
            return {}
        self.times.wait_s += done.wait_s
        self.times.wall_s = now - (self._first_rollout_at or now)
        metrics = {"drafter/learner_wait_s": done.wait_s}
        report = done.report
        if report is not None:
            if self._round_cold:
                self.times.cold_round_s += report.round_time_s
            else:
                self.times.round_s += report.round_time_s
            # nan (a round without steps has no loss) would reach the loggers as a hole: left out instead
            metrics.update({f"drafter/{name}": float(getattr(report, name)) for name in REPORT_FIELDS
                            if not math.isnan(float(getattr(report, name)))})
            metrics["drafter/published"] = float(report.published)
            metrics["drafter/budget_s"] = float(report.budget_s or 0.0)
            metrics["drafter/alarms"] = float(report.alarms_active)
            self.num_rounds += 1
            if report.gated:
                self._last_acceptance = report.acceptance_after if report.published else report.acceptance_before
            self.num_published += int(report.published)
            if report.event:
                self.events.append(f"round after step {report.policy_version}: {report.event}")
            for alarm in report.alarms:
                self._raise_alarm(f"round after step {report.policy_version}: {alarm}")
        if done.probe is not None:
            self.times.probe_s += done.probe.time_s
            version = self._pending_probe if self._pending_probe is not None else done.probe.policy_version
            probe = {f"drafter/probe_{name}": float(getattr(done.probe, k)) for k, name in PROBE_FIELDS.items()}
            probe["drafter/probe_policy_version"] = float(version)
            metrics.update(probe)
            self.probes.append({"step": version, **probe, "drafter/probe_drafter_version": done.probe.drafter_version,
                                "served_group_sums": done.probe.served_group_sums,
                                "group_counts": done.probe.group_counts})
            if done.probe.event:
                self.events.append(f"probe of policy version {version}: {done.probe.event}")
        self._pending_probe = None
        for event in done.events:  # the backend's drafter checks (`integrations.drafter_watch`)
            if event.startswith("ALARM "):
                self._raise_alarm(event.removeprefix("ALARM "))
            else:
                self.events.append(event)
        metrics["drafter/events"] = float(len(self.events))
        return metrics

    @property
    def alarms(self) -> list[str]:
        """The learner's alarms among the events, in order."""
        return [event.removeprefix("ALARM ") for event in self.events if event.startswith("ALARM ")]

    def _raise_alarm(self, line: str) -> None:
        """Record a learner alarm as an event and log it (once: the learner raises each alarm once)."""
        self.events.append(f"ALARM {line}")
        logger.warning(f"specroll: WARNING: {line}")
