"""DrafterScorer: the drafter LM's log q on recorded positions, its distillation loss and expected acceptance.

`log_q` is the drafter's log-softmax at the rollouts' temperature (as the engine samples it) at each
completion position of a teacher-forced `DraftBatch`; `loss` compares it with the recorded top-k p
(`divergence`), `acceptance` is Σ min(p, q) per position. Scoring entries and prompt groups for the paired
decisions is `scorer.Scorer`'s, the same for every family.
"""

from __future__ import annotations

import torch

from ..divergence import expected_acceptance
from ..scorer import Loss, Scorer
from .data import DraftBatch, collate


class DrafterScorer(Scorer):
    def __init__(self, temperature: float, batch_size: int, recency_decay: float, device: torch.device):
        super().__init__(collate, temperature, batch_size, recency_decay, device)

    def log_q(self, drafter: torch.nn.Module, batch: DraftBatch) -> torch.Tensor:
        """Drafter log-probs at each completion position, at the rollouts' temperature (over its draft vocabulary,
        if any: `Scorer.over`): [B, T, V]."""
        logits = drafter(input_ids=batch.input_ids).logits  # [B, L, V]
        index = batch.loss_index[..., None].expand(-1, -1, logits.shape[-1])  # [B, T, V]
        return self.restricted((logits.gather(1, index).float() / self.temperature).log_softmax(-1))

    def loss(self, drafter: torch.nn.Module, batch: DraftBatch, loss_fn: Loss) -> torch.Tensor:
        """The batch's distillation loss: per-position `loss_fn` weighted (weights sum to 1 per rollout),
        averaged over rollouts."""
        per_position = loss_fn(self.log_q(drafter, batch), batch.topk_ids, batch.topk_probs)  # [B, T]
        return (per_position * batch.weights).sum() / batch.weights.shape[0]

    def acceptance(self, drafter: torch.nn.Module, batch: DraftBatch) -> torch.Tensor:
        """Σ min(p, q) at each completion position: [B, T]."""
        return expected_acceptance(self.log_q(drafter, batch), batch.topk_ids, batch.topk_probs)
