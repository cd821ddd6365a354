"""specroll.online_drafter — the drafter follows the moving policy: rollouts' signals → replay buffer → learner.

No Ray, no TRL: the learner runs in any process that receives rollouts (`specroll.rollout.Rollout` with
`signals`) and pushes `published_state_dict()` to engines with `update_drafter`. Backends take the
`OnlineLearner` protocol (`online_learner.py`) and let `make_online_learner` pick the learner for a drafter.

One learner seam, `learner.Learner` (rounds, publish gate, watchdog, probe, alarms; no files), and per
drafter family the same three modules — a drafter kind is data + scorer + learner:

    lm/      an independent drafter LM: data.py (BufferedRollout, DraftBatch, DraftBuffer), scorer.py
             (DrafterScorer), learner.py (DraftLearner, which also checkpoints)
    heads/   an EAGLE-style head or Medusa heads on the policy's hidden states: data.py (FeatureSequence,
             FeatureBatch, FeatureBuffer), scorer.py (HeadScorer), objectives.py, learner.py (HeadLearner)
    gate/    what decides what is served: holdout.py (the held-out prompt groups), held_out_scores.py,
             paired.py (the paired gain), candidate.py (the trained copy and its average), watchdog.py, alarms.py
    state/   the learner's resumable state: learner_state.py (`state_of` / `restore`) + checkpoint.py (its file)

Shared by both families at the top: buffer.py (the one version-keyed `ReplayBuffer`), batching.py (padding,
length batches), scorer.py (`Scorer`: per-entry and per-group scores), divergence.py (losses and expected
acceptance), reports.py, learner_config.py, offline.py (`train_offline`: the learner on a fixed sample set over a
budget, `specroll distill`'s and the demo heads' recipe), recording.py (`RecordingLearner`, replayed by
`specroll.tools.learner_replay`) and moved_paths.py (old recordings' module paths).
"""

from .buffer import BufferEntry, ReplayBuffer
from .divergence import bucketed_kl, bucketed_tv, expected_acceptance
from .gate.alarms import LearnerAlarms
from .gate.candidate import Candidate
from .gate.holdout import HoldoutSet
from .gate.paired import GroupScores, PairedGain, paired_gain
from .heads.data import FeatureBatch, FeatureBuffer, FeatureSequence
from .heads.learner import HeadLearner
from .heads.scorer import HeadScorer
from .learner import Learner
from .learner_config import BufferConfig, LearnerConfig
from .lm.data import BufferedRollout, DraftBatch, DraftBuffer
from .lm.learner import DraftLearner
from .lm.scorer import DrafterScorer
from .offline import OfflineResult, OfflineSchedule, train_offline
from .online_learner import OnlineLearner, make_online_learner
from .recording import RecordingLearner
from .reports import LearnerReport, ProbeReport
from .scorer import Scorer

__all__ = [
    "BufferConfig",
    "BufferEntry",
    "BufferedRollout",
    "Candidate",
    "DraftBatch",
    "DraftBuffer",
    "DraftLearner",
    "DrafterScorer",
    "FeatureBatch",
    "FeatureBuffer",
    "FeatureSequence",
    "GroupScores",
    "HeadLearner",
    "HeadScorer",
    "HoldoutSet",
    "Learner",
    "LearnerAlarms",
    "LearnerConfig",
    "LearnerReport",
    "OfflineResult",
    "OfflineSchedule",
    "OnlineLearner",
    "PairedGain",
    "ProbeReport",
    "RecordingLearner",
    "ReplayBuffer",
    "Scorer",
    "bucketed_kl",
    "bucketed_tv",
    "expected_acceptance",
    "make_online_learner",
    "paired_gain",
    "train_offline",
]
