"""Scorer: how the learner trains and scores a drafter family's drafter, per entry and per prompt group.

The learner asks its scorer three things, the same for every family: `loss(drafter, batch, loss_fn)`,
a batch's distillation loss; `score_entries(drafter, entries)`, each entry's expected-acceptance sum
Σ min(p, q), position count and sum of the invariant sampler's per-position bound (`invariant_bound`), for the
held-out set and probes; `group(per_entry, keys)`, those sums
per prompt group for the paired decisions of `gate/paired.py`, a group of policy version v weighed
`recency_decay ** (newest − v)`. A family (`lm.scorer.DrafterScorer`, `heads.scorer.HeadScorer`) says
how its drafter is trained on a batch (`loss`) and scored there (`acceptance`, per position); scoring
entries in batches of similar length and grouping them are this module's, once for both.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from .batching import length_batches
from .buffer import BufferEntry
from .divergence import restrict
from .gate.holdout import GroupKey
from .gate.paired import GroupScores

Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (log q, top-k ids, p) -> per position
SCORE_COLUMNS = 3  # `score_entries`' columns: acceptance sum, position count, invariant-bound sum


def invariant_bound(acceptance: torch.Tensor) -> torch.Tensor:
    """The invariant sampler's acceptance at a position, bounded below from its expected acceptance a = Σ min(p, q)
    = 1 − TV: it keeps a draft iff the draft is the position's Gumbel-max token under both p and q, with
    probability ≥ (1 − TV) / (1 + TV) = a / (2 − a). Per position, then averaged: a / (2 − a) is convex, so the
    mean of the positions' bounds is at least (and, where acceptance is bimodal as a trained head's is, well
    above) the bound of the mean."""
    a = acceptance.clamp(0.0, 1.0)
    return a / (2 - a)


class Scorer(ABC):
    """`collate(entries)` pads a family's entries into its batch (weight 1 at every completion position).

    `vocab_ids` [N], when set (`over`), is the draft vocabulary of the drafter being trained or scored: its q is
    renormalised over those ids (`divergence.restrict`), as the engine drafts with it."""

    def __init__(self, collate: Callable[[list[Any]], Any], temperature: float, batch_size: int,
                 recency_decay: float, device: torch.device):
        self.collate = collate
        self.temperature = temperature
        self.batch_size = batch_size
        self.recency_decay = recency_decay
        self.device = device
        self.vocab_ids: torch.Tensor | None = None

    @contextlib.contextmanager
    def over(self, vocab_ids: torch.Tensor | None) -> Iterator[None]:
        """Train or score a drafter whose draft vocabulary is `vocab_ids` [N] (None: the whole vocabulary)."""
        before, self.vocab_ids = self.vocab_ids, vocab_ids
        try:
            yield
        finally:
            self.vocab_ids = before

    def head_log_q(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """log q at the rollouts' temperature from hidden states [..., H] through `lm_head`'s rows for the current
        draft vocabulary only (`over`: [..., N], column j for its j-th sorted id; [..., V] without one). At a 32k
        vocabulary and N = 2,048 that is the head's matmul, softmax and backward at 1/16 of the full head's size;
        `local_ids` maps target ids into these columns."""
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        ids = self._sorted_ids(weight.shape[0], hidden.device)
        if ids is not None:
            weight, bias = weight[ids], None if bias is None else bias[ids]
        logits = torch.nn.functional.linear(hidden, weight, bias)
        return (logits.float() / self.temperature).log_softmax(-1)

    def frozen_head_log_q(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """`head_log_q` through the policy's LM head read frozen: its weights detached, in `hidden`'s device and
        dtype (no gradient reaches the policy; a head learner reads it live, as a sync updates it in place)."""
        bias = getattr(lm_head, "bias", None)
        frozen = SimpleNamespace(weight=lm_head.weight.detach().to(hidden.device, hidden.dtype),
                                 bias=None if bias is None else bias.detach().to(hidden.device, hidden.dtype))
        return self.head_log_q(hidden, frozen)

    def local_ids(self, topk_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Target ids [...] as `head_log_q`'s columns: their index in the draft vocabulary, N (a column past the
        last one: `divergence` reads it as q = 0) for an id outside it; the ids themselves without one."""
        ids = self._sorted_ids(vocab_size, topk_ids.device)
        if ids is None:
            return topk_ids
        at = torch.searchsorted(ids, topk_ids).clamp_max(ids.numel() - 1)
        return torch.where(ids[at] == topk_ids, at, ids.numel())

    def _sorted_ids(self, width: int, device: torch.device) -> torch.Tensor | None:
        if self.vocab_ids is None:
            return None
        ids = self.vocab_ids.to(device)
        return ids[ids < width].sort().values

    def restricted(self, log_q: torch.Tensor) -> torch.Tensor:
        """log q [..., V] over the current draft vocabulary (`over`; ids past the drafter's V are left out)."""
        if self.vocab_ids is None:
            return log_q
        width = log_q.shape[-1]
        allowed = torch.zeros(width, dtype=torch.bool, device=log_q.device)
        allowed[self.vocab_ids[self.vocab_ids < width].to(log_q.device)] = True
        return restrict(log_q, allowed)

    @abstractmethod
    def loss(self, drafter: nn.Module, batch: Any, loss_fn: Loss) -> torch.Tensor:
        """The batch's distillation loss (a scalar), `loss_fn` per position weighted by `batch.weights`."""

    @abstractmethod
    def acceptance(self, drafter: nn.Module, batch: Any) -> torch.Tensor:
        """Expected acceptance Σ min(p, q) at each of the batch's positions: [B, N], read where `batch.weights` > 0."""

    @torch.inference_mode()
    def score_entries(self, drafter: nn.Module, entries: list[BufferEntry]) -> torch.Tensor:
        """Each entry's expected acceptance sum, completion-position count and sum of the invariant sampler's
        per-position bound (`invariant_bound`): [N, 3] float64."""
        per_entry = torch.zeros(len(entries), SCORE_COLUMNS, dtype=torch.float64)  # [N, (sum, count, bound sum)]
        for chunk in length_batches([e.token_ids.shape[0] for e in entries], self.batch_size):
            rows = torch.tensor(chunk)  # [B] entry indices, batched by length
            batch = self.collate([entries[i] for i in rows.tolist()]).to(self.device)
            acc = self.acceptance(drafter, batch)  # [B, N]
            per_entry[rows, 0] = (acc * batch.weights).sum(1).double().cpu()
            per_entry[rows, 1] = batch.weights.sum(1).double().cpu()
            per_entry[rows, 2] = (invariant_bound(acc) * batch.weights).sum(1).double().cpu()
        return per_entry

    def group(self, per_entry: torch.Tensor, keys: list[GroupKey]) -> GroupScores:
        """Per-entry scores [N, 3] summed per group (in order of first appearance), recency-weighted."""
        index: dict[GroupKey, int] = {}
        group_of = torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)  # [N]
        groups = torch.zeros(len(index), SCORE_COLUMNS, dtype=torch.float64).index_add_(0, group_of, per_entry)
        newest = max(version for version, _ in index)
        weights = torch.tensor([self.recency_decay ** (newest - version) for version, _ in index], dtype=torch.float64)
        return GroupScores(groups[:, 0], groups[:, 1], weights, bound_sums=groups[:, 2])

    def score_groups(self, drafter: nn.Module, entries: list[BufferEntry], keys: list[GroupKey]) -> GroupScores:
        """`group(score_entries(...))`: one drafter's scores per group."""
        return self.group(self.score_entries(drafter, entries), keys)
