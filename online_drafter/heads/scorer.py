"""HeadScorer: a head's training loss and its expected acceptance Σ min(p, q) on recorded sequences.

Both go through the head's objective (`heads.objectives`: log q at every draft depth the head is scored
at), against the target's recorded top-k p (`divergence`). A position's expected acceptance is the
mean over those depths — EAGLE's first draft (real features) and second (its own predicted feature),
Medusa's K heads — so a head that drafts well only one step ahead does not score as if every draft were
its first. Training may take only the first `train_depths`. Scoring entries and prompt groups for the
paired decisions is `scorer.Scorer`'s, the same for every family.
"""

from __future__ import annotations

import torch
from torch import nn

from ..divergence import expected_acceptance
from ..scorer import Loss, Scorer
from .data import FeatureBatch, collate
from .objectives import HeadObjective


class HeadScorer(Scorer):
    def __init__(self, objective: HeadObjective, temperature: float, batch_size: int, recency_decay: float,
                 device: torch.device, train_depths: int | None = None):
        if train_depths is not None and not 1 <= train_depths <= objective.depths:
            raise ValueError(f"train_depths={train_depths} is invalid for this head: None (all) or an int in "
                             f"[1, {objective.depths}], its draft depths")
        super().__init__(collate, temperature, batch_size, recency_decay, device)
        self.objective = objective
        self.train_depths = train_depths

    def loss(self, head: nn.Module, batch: FeatureBatch, loss_fn: Loss) -> torch.Tensor:
        """Distillation loss per completion position (weighted: weights sum to 1 per sequence) and trained depth
        (the first `train_depths`), averaged over sequences and depths, plus the objective's auxiliary term."""
        out = self.objective(head, batch, self.temperature, self.train_depths)
        log_q = self.restricted(out.log_q)  # [B, D, L, V]
        depths = log_q.shape[1]
        per_position = torch.stack([loss_fn(log_q[:, d], batch.topk_ids, batch.topk_probs)
                                    for d in range(depths)], 1)  # [B, D, L]
        return (per_position * batch.weights[:, None]).sum() / (batch.weights.sum() * depths) + out.aux_loss

    def acceptance(self, head: nn.Module, batch: FeatureBatch) -> torch.Tensor:
        """Σ min(p, q) at each sequence position, averaged over the depths the head is scored at: [B, L]."""
        log_q = self.restricted(self.objective(head, batch, self.temperature).log_q)  # [B, D, L, V]
        return torch.stack([expected_acceptance(log_q[:, d], batch.topk_ids, batch.topk_probs)
                            for d in range(log_q.shape[1])], 1).mean(1)
