"""`SpecEngine`'s weights between `generate` calls: new policy and drafter versions, and the draft vocabulary.
The engine holds one (`SpecEngine.weights`) and delegates its public `update_target`, `load_drafter`,
`set_draft_vocab`, `draft_vocab`, `served_drafter_digest` and the versions to it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .drafters.draft_vocab import DraftVocab
from .drafters.protocol import Drafter
from .drafters.version import DrafterVersion, drafter_digest
from .models.runner import ModelRunner
from .models.weights import copy_into


class EngineWeights:
    """The weights one engine serves and their versions: the target's (`policy_version`) and the drafter's
    (`drafter_version`, with the held-out acceptance it came with, if any)."""

    def __init__(self, target: ModelRunner, drafter: Drafter | None, dtype: torch.dtype):
        self.target, self.drafter, self.dtype = target, drafter, dtype
        self.vocab_size = target.vocab_size
        self.policy_version = 0
        self.drafter_version = 0
        self.drafter_acceptance: float | None = None  # the served version's held-out acceptance, if it came with one
        self.drafter_invariant_acceptance: float | None = None  # ... its bound under the invariant sampler

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        """Draft over `vocab`'s target ids only (None: the whole vocabulary), between `generate` calls. The
        output is the target's either way; a subset only makes drafts cheaper and some of them impossible.
        A drafter version that carries one (`load_drafter`) does the same."""
        if self.drafter is None:
            raise ValueError("set_draft_vocab called on an engine without a drafter")
        if vocab is not None and vocab.vocab_size != self.vocab_size:
            raise ValueError(f"draft vocabulary over {vocab.vocab_size} ids is invalid: the target has "
                             f"{self.vocab_size}")
        self.drafter.set_draft_vocab(vocab)

    def draft_vocab(self) -> torch.Tensor | None:
        """The target ids the drafter drafts over now [N] (None: the whole vocabulary, or no drafter)."""
        return None if self.drafter is None else self.drafter.draft_vocab()

    def update_target(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new policy weights (all or some parameters, by name) between `generate` calls."""
        copy_into(self.target.model, named_tensors, "target")
        self.policy_version = version

    def load_drafter(self, version: DrafterVersion) -> None:
        """Serve drafter `version` between `generate` calls: its weights (caches are kept, not reallocated), its draft
        vocabulary (None: the whole one) and its held-out acceptance (with `EngineConfig.speculation="when_learned"`
        it decides whether the engine drafts at all: `SpecEngine.speculating`)."""
        if self.drafter is None or not self.drafter.trainable:
            raise ValueError("load_drafter called on an engine without a drafter that has weights "
                             f"(drafters: {self.drafter.names if self.drafter else None})")
        self.drafter.load_weights(version.weights)
        self.set_draft_vocab(None if version.draft_vocab is None else DraftVocab(version.draft_vocab, self.vocab_size))
        self.drafter_acceptance = version.acceptance
        self.drafter_invariant_acceptance = version.served_invariant_acceptance
        self.drafter_version = version.number

    def served_drafter_digest(self, weights: torch.nn.Module) -> str:
        """The digest of the drafter this engine serves (`DrafterVersion.digest` in the engine's dtype): `weights`'
        parameters — the module passed to the engine as its drafter, which it drafts with — and the draft
        vocabulary it drafts over now."""
        return drafter_digest(dict(weights.named_parameters()), self.draft_vocab(), self.dtype)
