"""specroll.online_drafter — signals → `DraftBuffer` → `DraftLearner`: the drafter follows the policy.

No Ray, no TRL: the learner runs in any process that receives rollouts (`specroll.rollout.Rollout`
with `signals`) and pushes `published_state_dict()` to engines with `update_drafter`.
"""

from .buffer import BufferConfig, DraftBuffer
from .divergence import bucketed_kl, bucketed_tv, expected_acceptance
from .draft_batch import BufferedRollout, DraftBatch
from .learner import DraftLearner
from .learner_config import LearnerConfig
from .reports import LearnerReport, ProbeReport

__all__ = [
    "BufferConfig",
    "BufferedRollout",
    "DraftBatch",
    "DraftBuffer",
    "DraftLearner",
    "LearnerConfig",
    "LearnerReport",
    "ProbeReport",
    "bucketed_kl",
    "bucketed_tv",
    "expected_acceptance",
]
