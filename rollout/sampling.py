"""Logits → processed distributions, and the speculative accept/reject rule as whole-tensor ops.

Notation follows Leviathan et al. (2023) and Chen et al. (2023): `p` is the target's processed
distribution, `q` the drafter's. Draft i is accepted with probability min(1, p(d_i) / q(d_i)); at
the first rejection a token is drawn from norm(max(p − q, 0)); when every draft passes, a bonus
token is drawn from p at position γ + 1. The emitted tokens are then distributed exactly as p.

Greedy decoding is the T → 0 limit: p and q become one-hot at their argmax, so the same rule
accepts a draft iff it equals the target's argmax and resamples the target's argmax otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SamplingParams


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Processed probabilities (temperature, then top-k, then top-p), shape of `logits`, fp32.

    For greedy params this returns the one-hot distribution at the argmax (the T → 0 limit). Where
    the logits hold a NaN or +inf, or are all -inf, there is no distribution: that row comes out NaN
    in both modes (softmax gives it; greedy marks it), which is how callers detect it.
    """
    logits = logits.float()
    if params.greedy:
        best = logits.max(-1, keepdim=True)  # max propagates NaN: its value is finite iff the row is usable
        one_hot = torch.zeros_like(logits).scatter_(-1, best.indices, 1.0)
        return one_hot.masked_fill_(~best.values.isfinite(), float("nan"))
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass *before* it
        # already reaches top_p. The first token is always kept.
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def logprob_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities the rollout reports: the processed distribution's, or for greedy the T = 1 one.

    A greedy distribution is one-hot (log-probs 0 / -inf), useless to a trainer, so greedy rollouts
    report the raw model's log-softmax.
    """
    if params.greedy:
        return logits.float().log_softmax(-1)
    return process_logits(logits, params).log()


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per distribution: `probs` [..., V] → ids [...]. Works for one-hot (greedy) rows.

    A NaN row (no distribution, see `process_logits`) draws uniformly instead of raising, as
    `torch.multinomial` would for the whole batch; callers discard such draws (`Verdict.no_distribution`,
    the engine's check of q). Valid rows draw exactly as before: the random stream does not depend on
    the values.
    """
    flat = probs.reshape(-1, probs.shape[-1]).nan_to_num(nan=1.0, posinf=1.0)
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


@dataclass
class Verdict:
    """Outcome of verifying one step's drafts for every live row."""

    accepted_len: torch.Tensor  # [B] int64, number of drafts kept (0..γ)
    accepted: torch.Tensor  # [B, γ] bool, draft i kept (prefix-closed)
    next_token: torch.Tensor  # [B] int64, residual sample or bonus token after the kept drafts
    tokens: torch.Tensor  # [B, γ + 1] int64, kept drafts then next_token (tail past it unused)
    no_distribution: torch.Tensor  # [B] bool, p was NaN where next_token was drawn: next_token is garbage


def verify(
    drafts: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    generator: torch.Generator | None,
    resample_residual: bool = True,
    draft_ok: torch.Tensor | None = None,
) -> Verdict:
    """Speculative rejection sampling for a batch of rows.

    drafts [B, γ] int64 (drafted tokens), q [B, γ, V] (drafter's processed probs they were drawn
    from), p [B, γ + 1, V] (target's processed probs at the same positions plus the bonus one).
    `draft_ok` [B] bool, if given, marks the rows whose drafts may be kept; the others take a plain
    step (no draft kept, next token from p), which is how a drafter's non-finite q is dropped.
    A draft is never kept where p is NaN (the comparison below is false), so the first NaN position
    of a row, if it reaches one, is where next_token is drawn: `no_distribution` flags that row.
    `resample_residual=False` draws the replacement from p instead of norm(max(p − q, 0)): that is a
    deliberately *wrong* sampler, kept only so the distribution test can prove it has power.
    """
    bsz, gamma = drafts.shape
    idx = drafts.unsqueeze(-1)
    p_d = p[:, :gamma].gather(-1, idx).squeeze(-1)  # [B, γ]
    q_d = q.gather(-1, idx).squeeze(-1)  # [B, γ]
    u = torch.rand(bsz, gamma, generator=generator, device=p.device)
    # u < p/q written without the division; q_d > 0 because d was drawn from q.
    accept = u * q_d < p_d  # [B, γ]
    if draft_ok is not None:
        accept &= draft_ok[:, None]
    accepted = accept.long().cumprod(dim=1).bool()  # [B, γ]
    accepted_len = accepted.sum(1)  # [B]

    rows = torch.arange(bsz, device=p.device)
    p_next = p[rows, accepted_len]  # [B, V]: target distribution at the first non-accepted slot
    no_distribution = ~p_next.sum(-1).isfinite()  # [B]
    if resample_residual and gamma > 0:
        q_next = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)[rows, accepted_len]  # [B, V]
        if draft_ok is not None:  # a dropped row's q (maybe NaN) plays no part: its residual is p
            q_next = torch.where(draft_ok[:, None], q_next, 0.0)
        residual = (p_next - q_next).clamp_min(0)  # bonus slot: q_next = 0 → residual = p
        mass = residual.sum(-1, keepdim=True)
        # Rounding can leave no mass when p ≈ q; then p itself is the right law to sample.
        residual = torch.where(mass > 1e-12, residual / mass.clamp_min(1e-30), p_next)
    else:
        residual = p_next
    next_token = sample(residual, generator)  # [B]
    tokens = torch.cat([drafts, drafts.new_zeros(bsz, 1)], dim=1)
    tokens.scatter_(1, accepted_len.unsqueeze(1), next_token.unsqueeze(1))
    return Verdict(accepted_len=accepted_len, accepted=accepted, next_token=next_token, tokens=tokens,
                   no_distribution=no_distribution)
