"""OwnCacheMixin: a mixin of the drafter-protocol parts shared by the heads that keep a ragged KV cache of their own.

EAGLE (`eagle.EagleDrafter`), EAGLE-3 (`eagle3.Eagle3Drafter`) and the block drafter (`block.BlockDrafter`) each
hold `head` (their weights, cast to the engine's dtype), `cache` (a `models.cache.RaggedKVCache` per row slot),
`draws` (`draft_vocab.VocabDraws`: drafting over a draft vocabulary) and `device`. What the engine asks of them
between steps is the same for all three: a prefill empties the row's slots (the first step catches the row's
context up from the target's states), a moved row moves its cache, `release`/`allocate` free and make it, a
weight update copies into `head`. `weights_role` names the weights in errors.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..core.batch import RowBuffers
from ..models.weights import copy_into
from .draft_vocab import DraftVocab
from .protocol import Drafter


class OwnCacheMixin(Drafter):
    weights_role = "head"

    def prefill(self, slots: torch.Tensor, rows: RowBuffers, count: torch.Tensor) -> None:
        """Empty the slots; the first step catches the prompt's context up (the target's prefill captured it)."""
        self.cache.reset_rows(slots)

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)

    def release(self) -> None:
        self.cache.release()

    def allocate(self) -> None:
        self.cache.allocate()

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        copy_into(self.head, state_dict, self.weights_role)

    def draft_vocab(self) -> torch.Tensor | None:
        return self.draws.ids

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        self.draws.set(vocab, self.device)
