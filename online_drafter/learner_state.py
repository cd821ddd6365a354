"""What a learner checkpoint holds, and how a fresh learner takes it back.

`state_of(learner)` is everything a resumed run needs: the published, frozen, trained and averaged
weights, the optimizer, the buffer, the held-out set, the counters and the sampling generator.
`restore(learner, state, where)` loads it into a learner built with the checkpoint's config and buffer,
checking every weight set against the learner's architecture (`copy_into` raises naming `where`). The
learner itself keeps no files: `lm.learner.DraftLearner.save`/`load` write and read these states
(`checkpoint.py`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from specroll.rollout.models.weights import copy_into

from .candidate import weights_of

if TYPE_CHECKING:
    from .learner import Learner

CHECKPOINT_KEYS = ("config", "version", "published", "frozen", "candidate", "averaged", "optimizer", "buffer",
                   "holdout", "generator")


def state_of(learner: Learner) -> dict[str, Any]:
    return {
        "config": asdict(learner.config),
        "version": learner.version,
        "published": learner._published_weights,
        "frozen": weights_of(learner.frozen),
        "candidate": weights_of(learner.candidate.model),
        "averaged": weights_of(learner.candidate.averaged),
        "optimizer": learner.candidate.optimizer.state_dict(),
        "buffer": learner.buffer.state_dict(),
        "holdout": learner.holdout.state_dict(),
        "generator": learner._generator.get_state(),
        # Draft vocabularies (absent without): each drafter's subset and the token counts they are recounted from.
        **({} if learner.vocab is None else {"draft_vocab": learner.vocab.state()}),
    }


def restore(learner: Learner, state: dict[str, Any], where: str) -> None:
    candidate = learner.candidate
    for model, key in ((learner.frozen, "frozen"), (candidate.model, "candidate"), (candidate.averaged, "averaged"),
                       (learner.published, "published")):
        copy_into(model, state[key], f"{where}: the drafter")
    learner._published_weights = state["published"]
    candidate.optimizer.load_state_dict(state["optimizer"])
    learner.version = state["version"]
    learner.holdout.load_state_dict(state["holdout"], learner.buffer.entry_type)
    learner.newest_policy_version = max([e.policy_version for e in learner.holdout.entries]
                                        + [max(learner.buffer.versions, default=-1)])
    learner._generator.set_state(state["generator"])
    vocab = state.get("draft_vocab")
    if vocab is not None:
        learner.set_draft_vocab(vocab["frozen"], vocab["counts"].shape[0])
        learner.vocab.load(vocab)
