"""The drafter LM's data: what the learner keeps of a rollout, the batch it trains on, and its replay buffer.

`to_buffered` keeps of a rollout its context (prompt + completion ids), the target's top-k p at each
completion position and where a draft was rejected (`BufferedRollout`). `collate` pads entries into a
`DraftBatch` for one teacher-forced drafter forward: the drafter reads each context once, causally; the
logits at index `prompt_len - 1 + t` predict completion token t, which is where p for position t was
recorded. Right padding is harmless under a causal mask, so no attention mask is passed; padded positions
carry weight 0. `DraftBuffer` is the learner's replay buffer (`buffer.ReplayBuffer`) over these entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specroll.rollout import Rollout

from ..batching import pad_entries
from ..buffer import ReplayBuffer, rejected_drafts


@dataclass
class BufferedRollout:
    """What the buffer keeps of one rollout: the context and the target's top-k at each position."""

    token_ids: torch.Tensor  # [P + T] int64, prompt then completion
    prompt_len: int  # P
    topk_ids: torch.Tensor  # [T, k] int64, target ids of p's top-k
    topk_probs: torch.Tensor  # [T, k] fp32, p at those ids
    rejected: torch.Tensor  # [T] bool, a draft was proposed here and rejected
    policy_version: int

    @property
    def num_positions(self) -> int:
        return self.topk_ids.shape[0]


@dataclass
class DraftBatch:
    """Padded tensors for a batch of B buffered rollouts (T = longest completion, L = longest context)."""

    input_ids: torch.Tensor  # [B, L] int64, right-padded with 0
    loss_index: torch.Tensor  # [B, T] int64, logits index predicting completion position t
    topk_ids: torch.Tensor  # [B, T, k] int64
    topk_probs: torch.Tensor  # [B, T, k] fp32
    weights: torch.Tensor  # [B, T] fp32, 0 at padding

    @property
    def num_positions(self) -> int:
        return int((self.weights > 0).sum())

    def to(self, device: torch.device | str) -> DraftBatch:
        return DraftBatch(*(t.to(device) for t in (
            self.input_ids, self.loss_index, self.topk_ids, self.topk_probs, self.weights
        )))


def to_buffered(rollout: Rollout) -> BufferedRollout:
    """Keep what learning needs of a rollout; `ValueError` if it was generated without signals."""
    signals = rollout.signals
    if signals is None:
        raise ValueError("rollout has no signals: generate with EngineConfig(record_signals=True)")
    num_pos = len(rollout.completion_ids)
    if num_pos == 0 or signals.topk_ids.shape[0] != num_pos:
        raise ValueError(
            f"rollout signals cover {signals.topk_ids.shape[0]} positions, completion has {num_pos}"
        )
    if not rollout.prompt_ids:
        raise ValueError("rollout has an empty prompt: the first completion token has no context")
    token_ids = torch.tensor(list(rollout.prompt_ids) + list(rollout.completion_ids), dtype=torch.long)
    return BufferedRollout(
        token_ids=token_ids,
        prompt_len=len(rollout.prompt_ids),
        topk_ids=signals.topk_ids.to("cpu", torch.long),
        topk_probs=signals.topk_probs.to("cpu", torch.float32),
        rejected=rejected_drafts(signals),
        policy_version=int(rollout.policy_version),
    )


def collate(entries: list[BufferedRollout], position_weights: list[torch.Tensor] | None = None) -> DraftBatch:
    """Pad `entries` into one batch; `position_weights[i]` [T_i] defaults to 1 at every position."""
    num_pos = max((e.num_positions for e in entries), default=0)
    padded = pad_entries(entries, num_pos, [0] * len(entries), position_weights)
    loss_index = torch.zeros(len(entries), num_pos, dtype=torch.long)
    for i, e in enumerate(entries):
        loss_index[i, : e.num_positions] = torch.arange(e.prompt_len - 1, e.prompt_len - 1 + e.num_positions)
    return DraftBatch(padded.token_ids, loss_index, padded.topk_ids, padded.topk_probs, padded.weights)


class DraftBuffer(ReplayBuffer):
    """The replay buffer of `BufferedRollout`s, drawn into `DraftBatch`es."""

    entry_type = BufferedRollout
    collate = staticmethod(collate)
