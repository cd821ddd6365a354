"""The speculative accept rules as whole-tensor ops: which drafts the target keeps, and the token after them.

Notation follows Leviathan et al. (2023) and Chen et al. (2023): `p` is the target's processed
distribution, `q` the drafter's (both from `logits.process_logits`). Every token is drawn by Gumbel-max,
argmax(log π + g), with noise g of its (request, position) (`noise.StepNoise`, from `randomness`) — never
of the step, slot or batch it was drawn in. A position's token noise g is shared: the drafter draws its
draft argmax(log q + g) with it, and the target's own draw at that position (plain step, bonus token) is
argmax(log p + g). The rules differ in which drafts they keep:

- `RejectionSampling` (the default): draft d is kept with probability min(1, p(d) / q(d)); at the first
  rejection a token is drawn from norm(max(p − q, 0)) (with separate residual noise); when every draft
  passes, the bonus token at position γ + 1 is the target's draw. The tokens are distributed exactly
  as p. Which tokens a seed gives depends on the drafter's q and on which positions were drafted —
  the row's γ schedule (fixed γ: the row's own accept history; γ = "auto": also the measured step
  times and the batch the policy saw) — but never on the slot, batch composition or worker. Because
  drafts share the token noise, a kept draft is usually the target's own draw, and a drafter equal to
  the target reproduces plain decoding exactly. This coupling of drafts to the plain draw is ours;
  Leviathan et al. draw drafts with independent randomness (same acceptance, same law).
- `InvariantSampling` (Daliri, Musco, Suresh 2024, arXiv 2408.07978): the target emits its draw
  argmax(log p + g) at every position, and a draft is kept iff it equals it. The output is plain
  Gumbel-max decoding's for the seed whatever the drafter or γ; a draft is kept with probability
  ≥ (1 − TV) / (1 + TV) instead of 1 − TV. The paper's scheme is this Gumbel-max coupling.

With γ = 0 both rules are the same plain Gumbel-max decoding. Greedy decoding is the T → 0
limit: p and q are one-hot at their argmax, no noise is drawn, and either rule keeps a draft iff it
equals the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .draft_q import DraftQ
from .noise import StepNoise, gumbel_max
from .randomness import Purpose


@dataclass
class Verdict:
    """Outcome of verifying one step's drafts for every live row."""

    accepted_len: torch.Tensor  # [B] int64, number of drafts kept (0..γ)
    accepted: torch.Tensor  # [B, γ] bool, draft i kept (prefix-closed)
    next_token: torch.Tensor  # [B] int64, residual sample or bonus token after the kept drafts
    tokens: torch.Tensor  # [B, γ + 1] int64, kept drafts then next_token (tail past it unused)
    no_distribution: torch.Tensor  # [B] bool, p was NaN where next_token was drawn: next_token is garbage


class AcceptRule(Protocol):
    """Which drafts the target keeps, and the token after them."""

    def verify(self, drafts: torch.Tensor, q: DraftQ, p: torch.Tensor, noise: StepNoise,
               draft_ok: torch.Tensor) -> Verdict:
        """drafts [n, γ] (drawn by `StepNoise.draw_draft`, or proposed with a point-mass q), q (the drafter's
        processed probs they were drawn from, `draft_q.DraftQ`), p [n, γ+1, V] (the target's at the same
        positions plus the bonus one); `draft_ok` [n, γ] bool, prefix-closed, marks the drafts that may be
        kept (a row's proposal may be shorter than γ, or dropped: then the row takes a plain step). After
        a row's last usable draft its next token is the target's own draw. A draft is never kept where p
        is NaN, so the first NaN position of a row, if it reaches one, is where next_token is drawn:
        `no_distribution` flags that row."""
        ...


def _kept_prefix(accept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts kept: the prefix before the first rejection. accept [n, γ] → accepted [n, γ], accepted_len [n]."""
    accepted = accept.long().cumprod(dim=1).bool()  # [n, γ]
    return accepted, accepted.sum(1)


class RejectionSampling:
    """Speculative rejection sampling (Leviathan et al. 2023): lossless in distribution.

    `resample_residual=False` draws the replacement from p instead of norm(max(p − q, 0)): that is a
    deliberately *wrong* rule, kept only so the distribution test can prove it has power.
    """

    def __init__(self, resample_residual: bool = True):
        self.resample_residual = resample_residual

    def verify(self, drafts: torch.Tensor, q: DraftQ, p: torch.Tensor, noise: StepNoise,
               draft_ok: torch.Tensor) -> Verdict:
        n, gamma = drafts.shape
        p_d = p[:, :gamma].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [n, γ]
        q_d = q.of(drafts)  # [n, γ]
        u = noise.uniform(gamma, Purpose.ACCEPT)  # [n, γ]
        # u < p/q written without the division; q_d > 0 because d was drawn from q. False where p is NaN.
        accepted, accepted_len = _kept_prefix((u * q_d < p_d) & draft_ok)
        # A usable draft was rejected: the next token comes from the residual. Otherwise (every usable
        # draft kept: the bonus token, a short proposal's next token, a plain step) it is p's own draw.
        rejected = accepted_len < draft_ok.sum(1)  # [n]

        rows = torch.arange(n, device=p.device)
        p_next = p[rows, accepted_len]  # [n, V]: target distribution at the first non-accepted slot
        residual = p_next
        if self.resample_residual and gamma > 0:
            q_next = q.row(drafts, accepted_len, rejected)  # [n, V]; zero where no draft was rejected (maybe NaN q)
            residual = (p_next - q_next).clamp_min(0)  # q_next = 0 → residual = p
            mass = residual.sum(-1, keepdim=True)
            # Rounding can leave no mass when p ≈ q; then p itself is the right law to sample.
            residual = torch.where(mass > 1e-12, residual / mass.clamp_min(1e-30), p_next)
        next_noise = None  # greedy draws no noise
        if not noise.greedy:
            own_draw = noise.token_at(accepted_len)  # [n, V]
            next_noise = own_draw if gamma == 0 else torch.where(
                rejected[:, None], noise.residual(accepted_len), own_draw)
        next_token = gumbel_max(residual, next_noise)  # [n]
        tokens = torch.cat([drafts, drafts.new_zeros(n, 1)], dim=1)  # [n, γ+1]
        tokens.scatter_(1, accepted_len.unsqueeze(1), next_token.unsqueeze(1))
        return Verdict(accepted_len=accepted_len, accepted=accepted, next_token=next_token, tokens=tokens,
                       no_distribution=~p_next.sum(-1).isfinite())


class InvariantSampling:
    """Drafter-invariant speculative sampling (Daliri, Musco, Suresh 2024): the output is plain
    Gumbel-max decoding's for the seed, whatever the drafter proposes."""

    def verify(self, drafts: torch.Tensor, q: DraftQ, p: torch.Tensor, noise: StepNoise,
               draft_ok: torch.Tensor) -> Verdict:
        n, gamma = drafts.shape
        has_p = p.sum(-1).isfinite()  # [n, γ+1]
        if gamma == 0 or not noise.by_row:
            # The target's token at every position of the step [n, γ+1], a position at a time (one [n, V] temporary).
            tokens = torch.stack([gumbel_max(p[:, i], noise.token_row(i)) for i in range(gamma + 1)], 1)
        else:
            tokens = self._tokens_read(drafts, p, noise, draft_ok & has_p[:, :gamma])
        # A kept draft equals the target's token, so `tokens` is already the row's kept drafts + next token.
        accepted, accepted_len = _kept_prefix((drafts == tokens[:, :gamma]) & has_p[:, :gamma] & draft_ok)
        rows = torch.arange(n, device=p.device)
        return Verdict(accepted_len=accepted_len, accepted=accepted, next_token=tokens[rows, accepted_len],
                       tokens=tokens, no_distribution=~has_p[rows, accepted_len])

    @staticmethod
    def _tokens_read(drafts: torch.Tensor, p: torch.Tensor, noise: StepNoise, may_keep: torch.Tensor) -> torch.Tensor:
        """The target's tokens [n, γ+1] where they are read: position i only for the rows that kept every draft
        before it (a row's tokens past its first rejection are never read, `Verdict.tokens`; left 0): ~(1 − α^(γ+1))
        / (1 − α) noise positions a row instead of γ + 1, the same tokens (`StepNoise.by_row`)."""
        n, gamma = drafts.shape
        tokens = torch.zeros(n, gamma + 1, dtype=torch.long, device=p.device)
        tokens[:, 0] = gumbel_max(p[:, 0], noise.token_row(0))
        going = may_keep[:, 0] & (drafts[:, 0] == tokens[:, 0])  # [n]: rows whose next position is read
        for i in range(1, gamma + 1):
            rows = going.nonzero()[:, 0]
            if not len(rows):
                break
            tokens[rows, i] = gumbel_max(p[rows, i], noise.token_rows(i, rows))
            if i < gamma:
                going[rows] = may_keep[rows, i] & (drafts[rows, i] == tokens[rows, i])
        return tokens


ACCEPT_RULES: dict[str, type[RejectionSampling] | type[InvariantSampling]] = {  # `EngineConfig.sampler` → rule
    "rejection": RejectionSampling,
    "invariant": InvariantSampling,
}
