"""HeadScorer: a head's training loss and its expected acceptance Σ min(p, q) on recorded sequences.

Both go through the head's objective (`heads.objectives`: the states behind q at every draft depth the head
is scored at), taken through the LM head at completion positions only and over the draft vocabulary's rows
(`HeadScorer.scored`), against the target's recorded top-k p (`divergence`). A position's expected acceptance is the
mean over those depths — EAGLE's first draft (real features) and second (its own predicted feature),
Medusa's K heads — so a head that drafts well only one step ahead does not score as if every draft were
its first. Training may take only the first `train_depths`. Scoring entries and prompt groups for the
paired decisions is `scorer.Scorer`'s, the same for every family.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def scored(self, head: nn.Module, batch: FeatureBatch, depths: int | None = None) -> Scored:
        """The objective's log q at the batch's completion positions only (`completion_index`), through the draft
        vocabulary's rows of the LM head (`Scorer.head_log_q`: the head's matmul, softmax and backward at N of V
        columns), with the recorded top-k as its columns (`local_ids`) and the positions' weights."""
        out = self.objective(head, batch, self.temperature, depths)
        index = completion_index(batch.weights)  # [B, T]
        size, count, width = *out.states.shape[:2], out.states.shape[-1]
        states = out.states.gather(2, index[:, None, :, None].expand(size, count, -1, width))  # [B, D, T, H]
        top = index[..., None].expand(-1, -1, batch.topk_ids.shape[-1])
        ids, probs = batch.topk_ids.gather(1, top), batch.topk_probs.gather(1, top)  # [B, T, k]
        if out.lm_head is not None:  # the policy's LM head, frozen
            log_q = self.frozen_head_log_q(states, out.lm_head)  # [B, D, T, N]
            ids = self.local_ids(ids, out.lm_head.weight.shape[0])
        else:  # a head's own LM head over its draft ids: q over the whole vocabulary, restricted
            log_q = self.restricted((out.logits(states).float() / self.temperature).log_softmax(-1))
        return Scored(log_q, ids, probs, batch.weights.gather(1, index), index, out.aux_loss)

    def loss(self, head: nn.Module, batch: FeatureBatch, loss_fn: Loss) -> torch.Tensor:
        """Distillation loss per completion position (weighted: weights sum to 1 per sequence) and trained depth
        (the first `train_depths`), averaged over sequences and depths, plus the objective's auxiliary term."""
        s = self.scored(head, batch, self.train_depths)
        depths = s.log_q.shape[1]
        per_position = torch.stack([loss_fn(s.log_q[:, d], s.ids, s.probs) for d in range(depths)], 1)  # [B, D, T]
        return (per_position * s.weights[:, None]).sum() / (batch.weights.sum() * depths) + s.aux_loss

    def acceptance(self, head: nn.Module, batch: FeatureBatch) -> torch.Tensor:
        """Σ min(p, q) at each sequence position, averaged over the depths the head is scored at: [B, L] (0 where
        the weight is 0)."""
        s = self.scored(head, batch)
        per_depth = torch.stack([expected_acceptance(s.log_q[:, d], s.ids, s.probs)
                                 for d in range(s.log_q.shape[1])], 1).mean(1)  # [B, T]
        return per_depth.new_zeros(batch.weights.shape).scatter(1, s.index, per_depth * (s.weights > 0))


@dataclass
class Scored:
    log_q: torch.Tensor  # [B, D, T, N]: q at the completion positions, over the draft vocabulary's columns
    ids: torch.Tensor  # [B, T, k]: the recorded top-k ids as log_q's columns
    probs: torch.Tensor  # [B, T, k]
    weights: torch.Tensor  # [B, T]
    index: torch.Tensor  # [B, T]: the sequence positions
    aux_loss: torch.Tensor


def completion_index(weights: torch.Tensor) -> torch.Tensor:
    """[B, T] sequence positions of each row's weighted (completion) positions, in order, then its other positions
    to fill the row (weight 0): T = the most any row has. Each row's indices are distinct."""
    mask = weights > 0
    count = int(mask.sum(1).max()) if mask.numel() else 0
    return (~mask).to(torch.uint8).argsort(dim=1, stable=True)[:, :count]
