"""BlockScorer: a block drafter's training loss and expected acceptance on recorded sequences, by anchors.

The engine (`rollout.drafters.block`) anchors a block at the row's last kept token a: the anchor and k − 1 mask
positions, attending over the target's captured states at positions < a (the context) and bidirectionally
within the block; the output at a + j gives q for token a + j. Teacher-forced, every block of a sequence is one
pass (`block_log_q`): the fused context once (scoring: once for all its chunks of anchors), A blocks side by side,
each query seeing the context before its own anchor and its own block (DFlash's training layout). Anchors lie
where the engine puts them — at the last prompt token and at completion positions — so the tokens a block drafts
are completion tokens, and draft j of a block is trained against the target's recorded p for token a + j
(`divergence`; over the draft vocabulary when one is set, `Scorer.over`).

Training samples `anchors` anchors per sequence uniformly over those positions (`loss`: each sampled block's
k − 1 drafts weighted by their positions' weights); scoring takes every anchor (in chunks) and gives each
position the mean acceptance over the depths that draft it (`acceptance`): a position j is draft d of the block
anchored at j − 1 − d, as often in the engine as the blocks before it kept everything up to a.

The embedding and LM head are the policy's, read detached at every call: no gradient reaches the policy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specroll.rollout.drafters.heads.block import BlockHead

from ..divergence import expected_acceptance
from ..scorer import Loss, Scorer
from .data import FeatureBatch, collate

ANCHORS = 16  # blocks trained per sequence and step (`BlockScorer.anchors`)
SCORE_CHUNK = 32  # anchors per pass when scoring every one


class BlockScorer(Scorer):
    def __init__(self, embed: nn.Module, lm_head: nn.Module, temperature: float, batch_size: int,
                 recency_decay: float, device: torch.device, anchors: int = ANCHORS, seed: int = 0):
        if not (isinstance(anchors, int) and not isinstance(anchors, bool) and anchors >= 1):
            raise ValueError(f"anchors={anchors!r} is invalid: an int >= 1 (blocks trained per sequence)")
        super().__init__(collate, temperature, batch_size, recency_decay, device)
        self.embed, self.lm_head, self.anchors = embed, lm_head, anchors
        self.generator = torch.Generator().manual_seed(seed)

    def loss(self, head: nn.Module, batch: FeatureBatch, loss_fn: Loss) -> torch.Tensor:
        """Mean distillation loss over the sampled blocks' drafts, weighted by their positions' weights."""
        valid = _anchorable(batch)  # [B, L]
        size, length = valid.shape
        # Uniform over each sequence's anchorable positions: the r-th of them for r ~ U[0, count).
        counts = valid.sum(1)  # [B]
        rank = (torch.rand(size, self.anchors, generator=self.generator).to(valid.device)
                * counts.clamp_min(1)[:, None]).long()  # [B, A]
        order = torch.where(valid, torch.arange(length, device=valid.device), length).sort(1).values  # [B, L]
        anchors = order.gather(1, rank.clamp_max(length - 1)).clamp_max(length - 2)  # [B, A]
        log_q, ids, probs, weights = self._drafts(head, batch, anchors)
        weights = weights * (counts > 0)[:, None]
        per_draft = loss_fn(log_q, ids, probs)  # [B, A·(k−1)]
        return (per_draft * weights).sum() / weights.sum().clamp_min(1e-9)

    def acceptance(self, head: nn.Module, batch: FeatureBatch) -> torch.Tensor:
        """Σ min(p, q) per position [B, L], averaged over the depths at which the engine's blocks draft it."""
        valid = _anchorable(batch)
        size, length = valid.shape
        total = torch.zeros(size, length, device=valid.device)
        count = torch.zeros(size, length, device=valid.device)
        context_kv = self.context_kv(head, batch)  # once for every chunk of anchors
        for lo in range(0, length - 1, SCORE_CHUNK):
            anchors = torch.arange(lo, min(lo + SCORE_CHUNK, length - 1), device=valid.device)[None].expand(size, -1)
            log_q, ids, probs, _ = self._drafts(head, batch, anchors, context_kv)
            accepted = expected_acceptance(log_q, ids, probs)  # [B, A·(k−1)]
            at, used = self._targets(anchors, head.block_size, length)
            used = used & valid.gather(1, anchors).repeat_interleave(head.block_size - 1, 1)
            total.scatter_add_(1, at, torch.where(used, accepted.float(), 0.0))
            count.scatter_add_(1, at, used.float())
        return total / count.clamp_min(1)

    def _targets(self, anchors: torch.Tensor, block_size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence positions a + j of each block's drafts (j = 1 … k − 1) [B, A·(k−1)], clamped, and which are real."""
        at = (anchors[:, :, None] + torch.arange(1, block_size, device=anchors.device)).flatten(1)
        return at.clamp_max(length - 1), at < length

    def _drafts(self, head: BlockHead, batch: FeatureBatch, anchors: torch.Tensor, context_kv: list | None = None):
        """The blocks anchored at `anchors` [B, A]: (log q [B, A·(k−1), N or V], p's top-k ids in q's columns and
        probabilities [B, A·(k−1), k'], the drafted positions' weights [B, A·(k−1)])."""
        log_q = self.block_log_q(head, batch, anchors, context_kv)
        at, real = self._targets(anchors, head.block_size, batch.token_ids.shape[1])
        gather = lambda t: t.gather(1, at[..., None].expand(-1, -1, t.shape[-1]))
        ids = self.local_ids(gather(batch.topk_ids), self.lm_head.weight.shape[0])
        return log_q, ids, gather(batch.topk_probs), batch.weights.gather(1, at) * real

    def context_kv(self, head: BlockHead, batch: FeatureBatch) -> list:
        """The fused context's K/V per block layer (`BlockHead.context_kv`) over the whole sequence [B, C = L − 1]:
        what every block of it attends to, the part before its anchor."""
        hidden = batch.hidden.to(head.fc.weight.dtype)  # [B, L−1, m·H]
        size, context_len = hidden.shape[:2]
        positions = torch.arange(context_len, device=hidden.device)[None].expand(size, -1)
        return head.context_kv(head.fuse(hidden), positions)

    def block_log_q(self, head: BlockHead, batch: FeatureBatch, anchors: torch.Tensor,
                    context_kv: list | None = None) -> torch.Tensor:
        """log q [B, A·(k−1), N or V] of the drafts of the blocks anchored at `anchors` [B, A] (sequence positions
        < L − 1), teacher-forced: each block sees the context before its anchor and itself, as in the engine.
        `context_kv`: `self.context_kv(head, batch)` if already computed (scoring reuses it across anchor chunks)."""
        size, num_anchors = anchors.shape
        k, device = head.block_size, anchors.device
        dtype = head.fc.weight.dtype
        context_kv = self.context_kv(head, batch) if context_kv is None else context_kv
        context_len = batch.hidden.shape[1]
        tokens = batch.token_ids.gather(1, anchors)  # [B, A]
        embeds = F.embedding(tokens, self.embed.weight.detach().to(device, dtype))
        x = head.block_inputs(embeds).flatten(1, 2)  # [B, A·k, H]
        positions = (anchors[:, :, None] + torch.arange(k, device=device)).flatten(1)  # [B, A·k]
        group = torch.arange(num_anchors, device=device).repeat_interleave(k)  # [A·k]
        sees_context = torch.arange(context_len, device=device)[None, None] < anchors.repeat_interleave(k, 1)[..., None]
        sees_block = (group[:, None] == group[None, :]).expand(size, -1, -1)
        mask = torch.cat([sees_context, sees_block], -1)[:, None]  # [B, 1, A·k, C + A·k]

        def kv(i: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.cat([context_kv[i][0], keys], 2), torch.cat([context_kv[i][1], values], 2)

        out = head(x, positions, kv, mask).view(size, num_anchors, k, -1)[:, :, 1:].flatten(1, 2)  # [B, A·(k−1), H]
        return self.frozen_head_log_q(out, self.lm_head)


def _anchorable(batch: FeatureBatch) -> torch.Tensor:
    """[B, L] bool: positions a the engine anchors a block at — the token after a is a completion token (its
    recorded p is there: `topk_probs` is 0 outside completions)."""
    completion = batch.topk_probs.sum(-1) > 0  # [B, L]
    return F.pad(completion[:, 1:], (0, 1), value=False)
