"""BlockLearner: trains a block drafter (`rollout.drafters.heads.block.BlockHead`) online, publish-if-better.

The one `learner.Learner` (rounds, candidate, held-out set, gate, watchdog, probe, `LearnerConfig`) on the
feature heads' data (`heads.data`: the rollouts' captured target states — the outputs of the head's
`target_layers` — and top-k p, in the one replay buffer) with the block's scorer (`heads.block_scorer`: blocks
anchored over rollout positions, each draft trained against the recorded p of the token it drafts). Used like
`heads.learner.HeadLearner`; `make_online_learner` builds it for a `BlockHead`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..learner import Learner
from ..learner_config import LearnerConfig
from .block_scorer import ANCHORS, BlockScorer
from .data import FeatureBuffer
from .learner import _entry


class BlockLearner(Learner):
    """`Learner` over a `BlockHead`, reading the policy's `embed` and `lm_head` (never trained); `anchors`: blocks
    trained per sequence and step."""

    def __init__(self, head: nn.Module, embed: nn.Module, lm_head: nn.Module, config: LearnerConfig | None = None,
                 anchors: int = ANCHORS):
        config = config or LearnerConfig()
        scorer = BlockScorer(embed, lm_head, config.temperature, config.eval_batch_size, config.holdout_recency_decay,
                             torch.device(config.device), anchors, config.seed)
        super().__init__(head, config, FeatureBuffer(config.buffer), scorer, _entry)
