"""HeadScorer: a head's training loss and its expected acceptance Σ min(p, q) on recorded sequences.

Both go through the head's objective (`head_objectives`: log q at every draft depth the head is scored
at), against the target's recorded top-k p (`divergence`). A position's expected acceptance is the
mean over those depths — EAGLE's first draft (real features) and second (its own predicted feature),
Medusa's K heads — so a head that drafts well only one step ahead does not score as if every draft were
its first. Per-entry sums group into `GroupScores` for the paired decisions (`paired`), a group of
policy version v weighed `recency_decay ** (newest − v)` by `scoring.DrafterScorer.group`.
"""

from __future__ import annotations

import torch
from torch import nn

from .divergence import expected_acceptance
from .draft_batch import length_batches
from .head_data import FeatureBatch, FeatureSequence, collate
from .head_objectives import HeadObjective
from .holdout import GroupKey
from .paired import GroupScores
from .scoring import DrafterScorer, Loss


class HeadScorer:
    def __init__(self, objective: HeadObjective, temperature: float, batch_size: int, recency_decay: float,
                 device: torch.device, train_depths: int | None = None):
        if train_depths is not None and not 1 <= train_depths <= objective.depths:
            raise ValueError(f"train_depths={train_depths} is invalid for this head: None (all) or an int in "
                             f"[1, {objective.depths}], its draft depths")
        self.objective = objective
        self.train_depths = train_depths
        self.temperature = temperature
        self.batch_size = batch_size
        self.recency_decay = recency_decay
        self.device = device
        self._grouping = DrafterScorer(temperature, batch_size, recency_decay, device)

    def loss(self, head: nn.Module, batch: FeatureBatch, loss_fn: Loss) -> torch.Tensor:
        """Mean distillation loss per completion position and trained depth (the first `train_depths`), plus the
        objective's auxiliary term."""
        out = self.objective(head, batch, self.temperature, self.train_depths)
        depths = out.log_q.shape[1]
        per_position = torch.stack([loss_fn(out.log_q[:, d], batch.topk_ids, batch.topk_probs)
                                    for d in range(depths)], 1)  # [B, D, L]
        return (per_position * batch.weights[:, None]).sum() / (batch.weights.sum() * depths) + out.aux_loss

    @torch.inference_mode()
    def score_entries(self, head: nn.Module, entries: list[FeatureSequence]) -> torch.Tensor:
        """Expected acceptance sum and completion-position count of each entry: [N, 2] float64."""
        per_entry = torch.zeros(len(entries), 2, dtype=torch.float64)  # [N, (sum, count)]
        for chunk in length_batches([e.token_ids.shape[0] for e in entries], self.batch_size):
            rows = torch.tensor(chunk)  # [B] entry indices, batched by length
            batch = collate([entries[i] for i in rows.tolist()]).to(self.device)
            log_q = self.objective(head, batch, self.temperature).log_q  # [B, D, L, V]
            acc = torch.stack([expected_acceptance(log_q[:, d], batch.topk_ids, batch.topk_probs)
                               for d in range(log_q.shape[1])], 1).mean(1)  # [B, L]
            per_entry[rows, 0] = (acc * batch.weights).sum(1).double().cpu()
            per_entry[rows, 1] = batch.weights.sum(1).double().cpu()
        return per_entry

    def group(self, per_entry: torch.Tensor, keys: list[GroupKey]) -> GroupScores:
        """Per-entry scores [N, 2] summed per group, recency-weighted: `DrafterScorer.group`, the one
        definition of a group's weight for both learners."""
        return self._grouping.group(per_entry, keys)
