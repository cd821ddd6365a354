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
        """Drafter log-probs at each completion position, at the rollouts' temperature: [B, T, K], the columns of
        `Scorer.head_log_q` (K = N over a draft vocabulary: `Scorer.over`; read with `ids`).

        The LM head runs on the completion positions' hidden states only, through its draft-vocabulary rows: at a
        32k vocabulary the full head over every position was most of a training step (16 s of it, at 8 rollouts
        of ~300 tokens on one loaded core). A model whose logits are more than its head's output (soft-capped or
        scaled: Gemma 2, Cohere, Granite) takes its own forward and is restricted after."""
        if _plain_head(drafter.config):
            base = getattr(drafter, drafter.base_model_prefix)
            hidden = base(input_ids=batch.input_ids).last_hidden_state  # [B, L, H]
            index = batch.loss_index[..., None].expand(-1, -1, hidden.shape[-1])  # [B, T, H]
            return self.head_log_q(hidden.gather(1, index), drafter.get_output_embeddings())
        logits = drafter(input_ids=batch.input_ids).logits  # [B, L, V]
        index = batch.loss_index[..., None].expand(-1, -1, logits.shape[-1])  # [B, T, V]
        log_q = self.restricted((logits.gather(1, index).float() / self.temperature).log_softmax(-1))
        return log_q if self.vocab_ids is None else log_q[..., self._sorted_ids(log_q.shape[-1], log_q.device)]

    def ids(self, drafter: torch.nn.Module, batch: DraftBatch) -> torch.Tensor:
        """The batch's recorded top-k ids as `log_q`'s columns."""
        return self.local_ids(batch.topk_ids, drafter.get_output_embeddings().weight.shape[0])

    def loss(self, drafter: torch.nn.Module, batch: DraftBatch, loss_fn: Loss) -> torch.Tensor:
        """The batch's distillation loss: per-position `loss_fn` weighted (weights sum to 1 per rollout),
        averaged over rollouts."""
        per_position = loss_fn(self.log_q(drafter, batch), self.ids(drafter, batch), batch.topk_probs)  # [B, T]
        return (per_position * batch.weights).sum() / batch.weights.shape[0]

    def acceptance(self, drafter: torch.nn.Module, batch: DraftBatch) -> torch.Tensor:
        """Σ min(p, q) at each completion position: [B, T]."""
        return expected_acceptance(self.log_q(drafter, batch), self.ids(drafter, batch), batch.topk_probs)


def _plain_head(config) -> bool:
    """Whether the model's logits are its LM head's output (no soft-capping or scaling after it)."""
    return (getattr(config, "final_logit_softcapping", None) is None
            and getattr(config, "logit_scale", None) in (None, 1, 1.0)
            and getattr(config, "logits_scaling", None) in (None, 1, 1.0))
