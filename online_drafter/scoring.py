"""DrafterScorer: any drafter's log q and expected acceptance Σ min(p, q) on recorded positions, per group.

`log_q` is the drafter's log-softmax at the rollouts' temperature (as the engine samples it) at each
completion position of a teacher-forced batch; `score_groups` sums expected acceptance per prompt group
for the paired comparisons of `paired.py`, weighing a group of policy version v by
`recency_decay ** (newest − v)`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .divergence import expected_acceptance
from .draft_batch import BufferedRollout, DraftBatch, collate, length_batches
from .holdout import GroupKey
from .paired import GroupScores

Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (log q, top-k ids, p) -> per position


class DrafterScorer:
    def __init__(self, temperature: float, batch_size: int, recency_decay: float, device: torch.device):
        self.temperature = temperature
        self.batch_size = batch_size
        self.recency_decay = recency_decay
        self.device = device

    def log_q(self, drafter: torch.nn.Module, batch: DraftBatch) -> torch.Tensor:
        """Drafter log-probs at each completion position, at the rollouts' temperature: [B, T, V]."""
        logits = drafter(input_ids=batch.input_ids).logits  # [B, L, V]
        index = batch.loss_index[..., None].expand(-1, -1, logits.shape[-1])  # [B, T, V]
        return (logits.gather(1, index).float() / self.temperature).log_softmax(-1)

    def loss(self, drafter: torch.nn.Module, batch: DraftBatch, loss_fn: Loss) -> torch.Tensor:
        """The batch's distillation loss: per-position `loss_fn` weighted (weights sum to 1 per rollout),
        averaged over rollouts."""
        per_position = loss_fn(self.log_q(drafter, batch), batch.topk_ids, batch.topk_probs)  # [B, T]
        return (per_position * batch.weights).sum() / batch.weights.shape[0]

    @torch.inference_mode()
    def score_entries(self, drafter: torch.nn.Module, entries: list[BufferedRollout]) -> torch.Tensor:
        """Expected acceptance sum and position count of each entry: [N, 2] float64."""
        per_entry = torch.zeros(len(entries), 2, dtype=torch.float64)  # [N, (sum, count)]
        for chunk in length_batches([e.token_ids.shape[0] for e in entries], self.batch_size):
            rows = torch.tensor(chunk)  # [B] entry indices
            batch = collate([entries[i] for i in rows.tolist()]).to(self.device)
            acc = expected_acceptance(self.log_q(drafter, batch), batch.topk_ids, batch.topk_probs)  # [B, T]
            per_entry[rows, 0] = (acc * batch.weights).sum(1).double().cpu()
            per_entry[rows, 1] = batch.weights.sum(1).double().cpu()
        return per_entry

    def group(self, per_entry: torch.Tensor, keys: list[GroupKey]) -> GroupScores:
        """Per-entry scores [N, 2] summed per group (in order of first appearance), recency-weighted."""
        index: dict[GroupKey, int] = {}
        group_of = torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)  # [N]
        groups = torch.zeros(len(index), 2, dtype=torch.float64).index_add_(0, group_of, per_entry)
        newest = max(version for version, _ in index)
        weights = torch.tensor([self.recency_decay ** (newest - version) for version, _ in index], dtype=torch.float64)
        return GroupScores(groups[:, 0], groups[:, 1], weights)

    def score_groups(self, drafter: torch.nn.Module, entries: list[BufferedRollout],
                     keys: list[GroupKey]) -> GroupScores:
        """`group(score_entries(...))`: one drafter's scores per group."""
        return self.group(self.score_entries(drafter, entries), keys)
