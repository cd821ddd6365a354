"""DrafterWatch: a drafter is never lost silently — the served weights checked, the first batch judged.

    watch = DrafterWatch()
    watch.checked("drafter publish", {"worker 0": digest0, "worker 1": digest1}, learner_digest, version=3)
    ...                                    # the next generate call
    collapsed = watch.judge({"worker 0": stats0, "worker 1": stats1})   # names of engines that collapsed
    if collapsed and watch.collapse_confirmed(learner.served_estimate()): ...   # alarm, event, revert

The failure users of speculative RL systems report most is a drafter lost after a weight refit or a restart:
acceptance falls to 0 (mean accepted length to 1.0) and training goes on, slower, with no error. Both backends
(`ray_backend.drafter_guard` over the workers, `LocalBackend` on its engine) guard against it in two independent
ways after every *drafter event* — a drafter publish, a policy sync, a worker or learner restart, a resume:

- **Digest.** Every engine's drafter is hashed where it is (`SpecEngine.served_drafter_digest`) and compared with
  the learner's published digest (`DrafterVersion.digest`); an engine that serves anything else is reloaded.
  `checked` records what was found, as an event when it was wrong.
- **Collapse.** The first batch after the event is judged per engine (`judge`): an engine whose trained
  drafter verified at least `MIN_DRAFTED` drafts and kept at most `COLLAPSE_ACCEPTANCE` of them (or
  emitted at most `COLLAPSE_ACCEPTED_LEN` tokens per speculative row-step) has collapsed — if the learner's
  held-out estimate of that drafter is at least `MIN_ESTIMATE` (`collapse_confirmed`; a drafter the learner
  itself scores low is only a bad drafter, which the learner's own watchdog handles). A collapse raises the
  alarm (`drafter/collapse_alarms`), records an event, and the backend reverts the served drafter
  (`OnlineLearner.revert_served`). A batch that verified fewer drafts (γ chose plain decoding) leaves the
  check armed for the next. False-alarm rate: a drafter whose true per-draft acceptance is 0.2 keeps at most
  1 of 64 drafts with probability below 2e-5.

The drafts judged are the trained drafter's (`BatchStats.by_drafter`, every kind but the model-free
"suffix"). Events are handed to the trainer's learner schedule with the next collected round
(`LearnerRound.events`), so they reach the run's report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specroll.rollout.core.stats import BatchStats, DrafterStats
from specroll.rollout.drafters.registry import DRAFTERS

COLLAPSE_ACCEPTANCE = 0.02  # kept drafts / drafts at or below this ...
COLLAPSE_ACCEPTED_LEN = 1.02  # ... or tokens per speculative row-step at or below this ...
MIN_ESTIMATE = 0.2  # ... while the learner's held-out expected acceptance is at least this: a collapse
MIN_DRAFTED = 64  # drafts a batch must verify on one engine before it is judged


@dataclass
class DrafterWatch:
    """The drafter checks of one backend: the event the next batch is judged after, the counts, the events."""

    pending: str | None = None  # the drafter event whose first batch is still to be judged
    collapse_alarms: int = 0
    digest_mismatches: int = 0  # engines found serving other weights than the learner publishes
    events: list[str] = field(default_factory=list)  # since the last `take_events`

    def checked(self, event: str, served: Mapping[str, str], published: str, version: int) -> list[str]:
        """Record the digests found after `event` (`served`: engine name → digest) against the learner's
        `published` one at `version`; returns the engines that serve other weights. Arms the collapse check."""
        wrong = sorted(name for name, digest in served.items() if digest != published)
        if wrong:
            self.digest_mismatches += len(wrong)
            shown = ", ".join(f"{name} {served[name][:12]}" for name in wrong)
            self.events.append(f"after {event}: {shown} served other drafter weights than the published version "
                               f"{version} ({published[:12]}); reloaded")
        self.pending = event
        return wrong

    def judge(self, stats: Mapping[str, BatchStats]) -> list[str]:
        """The engines whose batch (`stats`: engine name → its `BatchStats`) collapsed, if a drafter event is
        pending and the batch verified enough drafts to judge it (else the check stays armed); sorted."""
        if self.pending is None:
            return []
        shares = {name: trained_share(batch) for name, batch in stats.items()}
        judged = {name: share for name, share in shares.items() if share.drafted >= MIN_DRAFTED}
        if not judged:
            return []
        collapsed = sorted(name for name, share in judged.items() if is_collapsed(share))
        if not collapsed:
            self.pending = None
        return collapsed

    def collapse_confirmed(self, collapsed: list[str], stats: Mapping[str, BatchStats], estimate: float,
                           version: int) -> bool:
        """Whether the learner's held-out `estimate` of the served `version` says the `collapsed` engines should
        have done better; if so, the alarm is raised and the event recorded. Disarms the check either way."""
        event, self.pending = self.pending, None
        if not collapsed or not estimate >= MIN_ESTIMATE:
            return False
        self.collapse_alarms += 1
        shown = ", ".join(f"{name} kept {trained_share(stats[name]).accepted} of {trained_share(stats[name]).drafted}"
                          f" drafts" for name in collapsed)
        self.events.append(f"ALARM drafter collapse after {event}: {shown} while the learner's held-out estimate "
                           f"of version {version} is {estimate:.3f}")
        return True

    def take_events(self) -> list[str]:
        events, self.events = self.events, []
        return events

    def metrics(self) -> dict[str, float]:
        return {"drafter/collapse_alarms": float(self.collapse_alarms),
                "drafter/digest_mismatches": float(self.digest_mismatches)}

    def state_dict(self) -> dict[str, Any]:
        return {"collapse_alarms": self.collapse_alarms, "digest_mismatches": self.digest_mismatches}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.collapse_alarms = int(state["collapse_alarms"])
        self.digest_mismatches = int(state["digest_mismatches"])


def trained_share(stats: BatchStats) -> DrafterStats:
    """The drafts of the drafter kinds that have weights — not the model-free ones (`DrafterSpec.model_free`), never
    judged — (all of them when the stats name no kind)."""
    kinds = [share for kind, share in stats.by_drafter.items() if not (kind in DRAFTERS and DRAFTERS[kind].model_free)]
    if not stats.by_drafter:
        return DrafterStats(stats.spec_row_steps, stats.drafted, stats.accepted)
    return sum(kinds, DrafterStats())


def is_collapsed(share: DrafterStats) -> bool:
    return share.acceptance_rate <= COLLAPSE_ACCEPTANCE or share.mean_accepted_len <= COLLAPSE_ACCEPTED_LEN
