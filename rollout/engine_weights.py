"""`SpecEngine`'s weights between `generate` calls: new policy and drafter versions, and the draft vocabulary.
The engine holds one (`SpecEngine.weights`) and delegates its public `update_target`, `update_drafter`,
`set_draft_vocab`, `draft_vocab` and the versions to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from transformers import PreTrainedModel

from .drafters.draft_vocab import DraftVocab, initial_ids
from .drafters.protocol import Drafter
from .models.runner import ModelRunner
from .models.weights import copy_into

# the drafters with an LM head to cut
VOCAB_DRAFTER_KINDS = ("model", "eagle", "eagle3", "medusa", "layer_skip", "block")
# A drafter state dict's held-out acceptance, in parts per million (an int64 [1] or [2]: no weight cast moves it):
# expected acceptance Σ min(p, q), then (optional) the mean of the positions' bounds under the invariant sampler;
# with `EngineConfig.speculation = "when_learned"` it decides whether the engine drafts at all (`speculating`).
ACCEPTANCE_STATE_KEY = "specroll.held_out_acceptance_ppm"


class EngineWeights:
    """The weights one engine serves and their versions: the target's (`policy_version`) and the drafter's
    (`drafter_version`, with the held-out acceptance it came with, if any)."""

    def __init__(self, target: ModelRunner, drafter: Drafter | None):
        self.target, self.drafter = target, drafter
        self.vocab_size = target.vocab_size
        self.policy_version = 0
        self.drafter_version = 0
        self.drafter_acceptance: float | None = None  # the served version's held-out acceptance, if it came with one
        self.drafter_invariant_acceptance: float | None = None  # ... its bound under the invariant sampler

    def set_draft_vocab(self, ids: torch.Tensor | Sequence[int] | None) -> None:
        """Draft over these target ids only (None: the whole vocabulary), between `generate` calls. The
        output is the target's either way; a subset only makes drafts cheaper and some of them impossible.
        A drafter state dict carrying `drafters.draft_vocab.STATE_KEY` (`update_drafter`) does the same."""
        if self.drafter is None:
            raise ValueError("set_draft_vocab called on an engine without a drafter")
        self.drafter.set_draft_vocab(None if ids is None else DraftVocab(torch.as_tensor(ids), self.vocab_size))

    def draft_vocab(self) -> torch.Tensor | None:
        """The target ids the drafter drafts over now [N] (None: the whole vocabulary, or no drafter)."""
        return None if self.drafter is None else self.drafter.draft_vocab()

    def _first_draft_vocab(self, target: PreTrainedModel, size: int, weights: object = None) -> None:
        """`config.draft_vocab` before any rollout was counted: the subset the drafter's `weights` were trained over
        if they carry one, else the first `size` ids and the EOS ids (`drafters.draft_vocab.initial_ids`); the online
        learner publishes subsets counted from rollouts."""
        if size > self.vocab_size:
            raise ValueError(f"draft_vocab={size} is invalid: an int in [1, {self.vocab_size}] (the target's "
                             "vocabulary)")
        kinds = self.drafter.names if self.drafter else ()
        if not set(kinds) & set(VOCAB_DRAFTER_KINDS):
            raise ValueError(f"draft_vocab={size} is invalid with drafters {kinds}: it needs a drafter with an LM "
                             f"head, one of {VOCAB_DRAFTER_KINDS}")
        self.set_draft_vocab(initial_ids(size, self.vocab_size, target.config, weights))

    def update_target(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new policy weights (all or some parameters, by name) between `generate` calls."""
        copy_into(self.target.model, named_tensors, "target")
        self.policy_version = version

    def update_drafter(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new drafter weights between `generate` calls; caches are kept, not reallocated."""
        if self.drafter is None or not self.drafter.trainable:
            raise ValueError("update_drafter called on an engine without a drafter that has weights "
                             f"(drafters: {self.drafter.names if self.drafter else None})")
        ppm = state_dict.get(ACCEPTANCE_STATE_KEY)
        ppm = [] if ppm is None else [int(x) / 1e6 for x in ppm.reshape(-1).tolist()]
        self.drafter_acceptance = ppm[0] if ppm else None
        # Without its own bound (a one-number tag), the bound of the mean: a / (2 - a) (see `speculating`).
        self.drafter_invariant_acceptance = ppm[1] if len(ppm) > 1 else ppm[0] / (2 - ppm[0]) if ppm else None
        self.drafter.load_weights({k: v for k, v in state_dict.items() if k != ACCEPTANCE_STATE_KEY})
        self.drafter_version = version
