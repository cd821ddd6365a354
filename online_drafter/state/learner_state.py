"""What a learner checkpoint holds, and how a fresh learner takes it back.

`state_of(learner)` is everything a resumed run needs: the published, frozen, trained and averaged
weights, the optimizer, the buffer, the held-out set and the scores cached on it, the counters, the
sampling generator, the draft vocabularies and their counts, and the state the gate's budget and the
alarms decide on (`alarms.LearnerAlarms`: the recent rounds, the probes, what holds). `restore(learner,
state, where)` loads it into a learner of the same drafter architecture, checking every weight set against
it (`copy_into` raises naming `where`). The learner keeps its own `config` (a resumed run may change the
learner's settings; what it learnt stays), its buffer the same: the buffer's contents come back, its bounds
are the learner's. The learner itself keeps no files: `lm.learner.DraftLearner.save`/`load` write and read
these states (`checkpoint.py`); `specroll train --resume` keeps one beside every trainer checkpoint.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from specroll.rollout.models.weights import copy_into

from ..gate.candidate import weights_of
from ..reports import LearnerReport, ProbeReport
from ..scorer import SCORE_COLUMNS

if TYPE_CHECKING:
    from ..gate.alarms import LearnerAlarms
    from ..learner import Learner

CHECKPOINT_KEYS = ("config", "version", "published", "frozen", "candidate", "averaged", "optimizer", "buffer",
                   "holdout", "generator", "entry_scores", "timing", "alarms")


def state_of(learner: Learner) -> dict[str, Any]:
    learner = _require_learner(learner)
    return {
        "config": asdict(learner.config),
        "version": learner.version,
        "published": learner._published_weights,
        "frozen": weights_of(learner.frozen),
        "candidate": weights_of(learner.candidate.model),
        "averaged": weights_of(learner.candidate.averaged),
        # A copy: `Optimizer.state_dict()` hands out its live moment and step tensors, which the next round updates
        # in place (a learner loaded from a state taken in the same process then shared them with the saver).
        "optimizer": copy.deepcopy(learner.candidate.optimizer.state_dict()),
        "buffer": learner.buffer.state_dict(),
        "holdout": learner.holdout.state_dict(),
        "generator": learner._generator.get_state(),
        # Held-out scores of the published and frozen drafters: rescoring in other batches moves them by float
        # rounding, and the gate decides on them.
        "entry_scores": {name: scores.clone() for name, scores in learner._entry_scores.items()},
        "timing": {"scoring_s_per_entry": learner._scoring_s_per_entry,
                   "trained_since_gate_s": learner._trained_since_gate_s,
                   "candidate_changed": learner._candidate_changed, "step_s": learner.candidate.step_s},
        "alarms": _alarms_state(learner.alarms),
        # Draft vocabularies (absent without): each drafter's subset and the token counts they are recounted from.
        **({} if learner.vocab is None else {"draft_vocab": learner.vocab.state()}),
    }


def restore(learner: Learner, state: dict[str, Any], where: str) -> None:
    learner = _require_learner(learner)
    candidate = learner.candidate
    for model, key in ((learner.frozen, "frozen"), (candidate.model, "candidate"), (candidate.averaged, "averaged"),
                       (learner.published, "published")):
        copy_into(model, state[key], f"{where}: the drafter")
    learner._published_weights = state["published"]
    candidate.optimizer.load_state_dict(state["optimizer"])
    learner.version = state["version"]
    learner.buffer.load_state_dict(state["buffer"])
    learner.buffer.config = learner.config.buffer
    learner.holdout.load_state_dict(state["holdout"], learner.buffer.entry_type)
    learner.newest_policy_version = max([e.policy_version for e in learner.holdout.entries]
                                        + [max(learner.buffer.versions, default=-1)])
    learner._generator.set_state(state["generator"])
    vocab = state.get("draft_vocab")
    if vocab is not None:
        learner.set_draft_vocab(vocab["frozen"], vocab["counts"].shape[0])
        learner.vocab.load(vocab)
    # Scores saved before the invariant-bound column (`scorer.SCORE_COLUMNS`) are rescored when next read.
    learner._entry_scores = {name: scores.clone() for name, scores in state["entry_scores"].items()
                             if scores.shape[-1] == SCORE_COLUMNS}
    timing = state["timing"]
    learner._scoring_s_per_entry = float(timing["scoring_s_per_entry"])
    learner._trained_since_gate_s = float(timing["trained_since_gate_s"])
    learner._candidate_changed = bool(timing["candidate_changed"])
    candidate.step_s = float(timing["step_s"])
    _load_alarms(learner.alarms, state["alarms"])


def has_state(learner: Any) -> bool:
    """Whether `learner` has a state `state_of` can take (not a recording)."""
    try:
        _require_learner(learner)
    except ValueError:
        return False
    return True


def _require_learner(learner: Any) -> Learner:
    """The `Learner` whose state this is: `learner`, or the one a `served_acceptance.ServedAcceptance` wraps (it keeps
    nothing of its own: the served version's acceptance is the learner's `served_estimate`). A
    `recording.RecordingLearner` has none: it records one run from its start."""
    from ..learner import Learner
    from ..served_acceptance import ServedAcceptance

    if isinstance(learner, ServedAcceptance):
        learner = learner.learner
    if not isinstance(learner, Learner):
        raise ValueError(f"a {type(learner).__name__} keeps no checkpoint state: only a learner.Learner does (a "
                         "recording, learner.record_dir, is one run from its start: unset it to resume a run)")
    return learner


def _alarms_state(alarms: LearnerAlarms) -> dict[str, Any]:
    def probe(report: ProbeReport | None) -> dict[str, Any] | None:
        return None if report is None else asdict(report)

    return {"recent": [asdict(r) for r in alarms.recent], "rounds_since_publish": alarms.rounds_since_publish,
            "first_probe": probe(alarms.first_probe), "last_probe": probe(alarms.last_probe),
            "unjudged_probe": probe(alarms.unjudged_probe), "budgets_since_probe": list(alarms.budgets_since_probe),
            "probe_window": list(alarms.probe_window), "holding": sorted(alarms.holding)}


def _load_alarms(alarms: LearnerAlarms, state: dict[str, Any]) -> None:
    def probe(fields: dict[str, Any] | None) -> ProbeReport | None:
        return None if fields is None else ProbeReport(**fields)

    alarms.recent = deque((LearnerReport(**{**r, "alarms": tuple(r["alarms"])}) for r in state["recent"]),
                          maxlen=alarms.config.alarm_rounds)
    alarms.rounds_since_publish = int(state["rounds_since_publish"])
    alarms.first_probe, alarms.last_probe = probe(state["first_probe"]), probe(state["last_probe"])
    alarms.unjudged_probe = probe(state["unjudged_probe"])
    alarms.budgets_since_probe = [float(b) for b in state["budgets_since_probe"]]
    alarms.probe_window = [float(b) for b in state["probe_window"]]
    alarms.holding = set(state["holding"])
