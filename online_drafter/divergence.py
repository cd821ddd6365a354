"""Per-position divergences between the target's recorded top-k `p` and the drafter's full `q`.

Notation as in the engine: `p` is the target's processed distribution, `q` the drafter's. Only p's
top-k survives recording, so each position's vocabulary is split into buckets — one per top-k id
with p > 0, and one *tail* bucket for everything else (p_tail = 1 − Σ p_k, q_tail = 1 − Σ q_k over
those ids). Zero-probability columns (padding when k > V, ids cut by top-k / top-p) fall into the
tail, so duplicate padding ids are never counted twice.

- `expected_acceptance` = Σ_k min(p_k, q_k): the speculative acceptance probability of one draft,
  restricted to the top-k. It is a lower bound (the tail's share is unknown) and exact when p's
  support lies in the top-k.
- `bucketed_kl` = KL over the buckets (forward, p ‖ q): the learner's default loss. Without the
  tail bucket q could put mass outside the top-k for free, and that mass is exactly what a
  rejection costs; with it the loss is 0 only when q matches p on the top-k. It is smooth (TV's
  gradient vanishes wherever q ≥ p), and by Pinsker 1 − acceptance = TV ≤ sqrt(KL / 2), so driving
  it down drives acceptance up (DistillSpec, Zhou et al. 2023, find FKL a robust default).
- `bucketed_tv` = 1 − Σ_buckets min(p, q): the acceptance loss itself, offered as an option.
"""

from __future__ import annotations

import torch


def _bucket_masses(log_q: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor):
    """q at the top-k ids (0 at zero-p columns) and both tails: [B, T, V], [B, T, k] → [B, T, k], [B, T]."""
    valid = topk_probs > 0  # [B, T, k]
    log_q_k = log_q.gather(-1, topk_ids.clamp_max(log_q.shape[-1] - 1))  # [B, T, k]
    # Ids the drafter cannot emit have q = 0: past its vocabulary, or outside its draft vocabulary (log q = -inf,
    # `restrict`). Their p is in no bucket, so the KL's minimum is q ∝ p over what the drafter can emit.
    valid = valid & (topk_ids < log_q.shape[-1]) & log_q_k.isfinite()
    q_k = torch.where(valid, log_q_k.exp(), 0.0)  # [B, T, k]
    p_tail = (1 - topk_probs.sum(-1)).clamp_min(0)  # [B, T]
    q_tail = (1 - q_k.sum(-1)).clamp_min(0)  # [B, T]
    return valid, log_q_k, q_k, p_tail, q_tail


def restrict(log_q: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """log q [..., V] renormalised over the `allowed` ids [V] bool (a draft vocabulary: -inf elsewhere), as the
    engine's drafter computes q over its subset; None: log q as it is."""
    if allowed is None:
        return log_q
    masked = log_q.masked_fill(~allowed, float("-inf"))
    return masked - masked.logsumexp(-1, keepdim=True)


def expected_acceptance(log_q: torch.Tensor, topk_ids: torch.Tensor,
                        topk_probs: torch.Tensor) -> torch.Tensor:
    """Σ_k min(p_k, q_k) per position: log_q [B, T, V], topk [B, T, k] → [B, T]."""
    valid, _, q_k, _, _ = _bucket_masses(log_q, topk_ids, topk_probs)
    return torch.where(valid, torch.minimum(topk_probs, q_k), 0.0).sum(-1)


def bucketed_kl(log_q: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) over the top-k buckets plus the tail bucket: [B, T, V], [B, T, k] → [B, T]."""
    valid, log_q_k, _, p_tail, q_tail = _bucket_masses(log_q, topk_ids, topk_probs)
    p_k = torch.where(valid, topk_probs, 0.0)
    head = (torch.xlogy(p_k, p_k) - p_k * torch.where(valid, log_q_k, 0.0)).sum(-1)  # [B, T]
    tail = torch.xlogy(p_tail, p_tail) - p_tail * q_tail.clamp_min(1e-12).log()  # [B, T]
    return head + tail


def bucketed_tv(log_q: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor) -> torch.Tensor:
    """1 − Σ_buckets min(p, q), the coarse-grained total variation: [B, T, V], [B, T, k] → [B, T]."""
    valid, _, q_k, p_tail, q_tail = _bucket_masses(log_q, topk_ids, topk_probs)
    overlap = torch.where(valid, torch.minimum(topk_probs, q_k), 0.0).sum(-1)
    return 1 - overlap - torch.minimum(p_tail, q_tail)


LOSSES = {"kl": bucketed_kl, "tv": bucketed_tv}
