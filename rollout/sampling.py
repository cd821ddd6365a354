"""Logits → processed distributions, and the two speculative samplers as whole-tensor ops.

Notation follows Leviathan et al. (2023) and Chen et al. (2023): `p` is the target's processed
distribution, `q` the drafter's. Every token is drawn by Gumbel-max, argmax(log π + g), with noise g
of its (request, position) from `randomness` — never of the step, slot or batch it was drawn in. A
position's token noise g is shared: the drafter draws its draft argmax(log q + g) with it, and the
target's own draw at that position (plain step, bonus token) is argmax(log p + g). The samplers differ
in which drafts they keep:

- `RejectionSampler` (the default): draft d is kept with probability min(1, p(d) / q(d)); at the first
  rejection a token is drawn from norm(max(p − q, 0)) (with separate residual noise); when every draft
  passes, the bonus token at position γ + 1 is the target's draw. The tokens are distributed exactly
  as p. Which tokens a seed gives depends on the drafter's q and on which positions were drafted —
  the row's γ schedule (fixed γ: the row's own accept history; γ = "auto": also the measured step
  times and the batch the policy saw) — but never on the slot, batch composition or worker. Because
  drafts share the token noise, a kept draft is usually the target's own draw, and a drafter equal to
  the target reproduces plain decoding exactly. This coupling of drafts to the plain draw is ours;
  Leviathan et al. draw drafts with independent randomness (same acceptance, same law).
- `InvariantSampler` (Daliri, Musco, Suresh 2024, arXiv 2408.07978): the target emits its draw
  argmax(log p + g) at every position, and a draft is kept iff it equals it. The output is plain
  Gumbel-max decoding's for the seed whatever the drafter or γ; a draft is kept with probability
  ≥ (1 − TV) / (1 + TV) instead of 1 − TV. The paper's scheme is this Gumbel-max coupling.

With γ = 0 both samplers are the same plain Gumbel-max decoding. Greedy decoding is the T → 0
limit: p and q are one-hot at their argmax, no noise is drawn, and either rule keeps a draft iff it
equals the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .config import SamplingParams
from .randomness import Purpose, gumbel, uniform


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


def draw(probs: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """Gumbel-max: one token per distribution, argmax(log probs + noise), `probs` [..., V] → ids [...].

    `noise` None (greedy) takes the argmax. Zero-probability tokens are never drawn (log 0 = −inf). A NaN
    row (no distribution, see `process_logits`) gives some id instead of raising; callers discard such
    draws (`Verdict.no_distribution`, the engine's check of q).
    """
    if noise is None:
        return probs.argmax(-1)
    return (probs.log() + noise).argmax(-1)


@dataclass
class StepNoise:
    """Where one step's random numbers come from: the live rows' request keys [n], the sequence position
    of each row's first new token [n], and the step's width γ + 1. Greedy steps draw none."""

    keys: torch.Tensor
    start: torch.Tensor
    width: int
    vocab_size: int
    greedy: bool
    _token: torch.Tensor | None = None

    def narrow(self, width: int) -> StepNoise:
        """The same step's noise for its first `width` positions (a proposal narrower than asked)."""
        token = None if self._token is None else self._token[:, :width]
        return StepNoise(self.keys, self.start, width, self.vocab_size, self.greedy, token)

    def token(self) -> torch.Tensor | None:
        """The token noise of every position of the step [n, γ+1, V] (`Purpose.TOKEN`), computed once."""
        if self.greedy:
            return None
        if self._token is None:
            offsets = torch.arange(self.width, device=self.start.device)  # [γ+1]
            self._token = gumbel(self.keys, self.start[:, None] + offsets, Purpose.TOKEN, self.vocab_size)
        return self._token

    def draw_draft(self, q: torch.Tensor, i: int) -> torch.Tensor:
        """Draft i [n] from the drafter's processed q [n, V], with the token noise of its position."""
        token = self.token()
        return draw(q, None if token is None else token[:, i])

    def residual(self, offset: torch.Tensor) -> torch.Tensor | None:
        """Residual noise [n, V] at each row's position start + offset [n] (`Purpose.RESIDUAL`)."""
        if self.greedy:
            return None
        return gumbel(self.keys, (self.start + offset)[:, None], Purpose.RESIDUAL, self.vocab_size)[:, 0]

    def uniform(self, count: int, purpose: Purpose) -> torch.Tensor:
        """One uniform [n, count] at each of the first `count` positions of the step."""
        offsets = torch.arange(count, device=self.start.device)  # [count]
        return uniform(self.keys, self.start[:, None] + offsets, purpose)


@dataclass
class Verdict:
    """Outcome of verifying one step's drafts for every live row."""

    accepted_len: torch.Tensor  # [B] int64, number of drafts kept (0..γ)
    accepted: torch.Tensor  # [B, γ] bool, draft i kept (prefix-closed)
    next_token: torch.Tensor  # [B] int64, residual sample or bonus token after the kept drafts
    tokens: torch.Tensor  # [B, γ + 1] int64, kept drafts then next_token (tail past it unused)
    no_distribution: torch.Tensor  # [B] bool, p was NaN where next_token was drawn: next_token is garbage


class Sampler(Protocol):
    """Which drafts the target keeps, and the token after them."""

    def verify(self, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, noise: StepNoise,
               draft_ok: torch.Tensor) -> Verdict:
        """drafts [n, γ] (drawn by `StepNoise.draw_draft`, or proposed with a point-mass q), q [n, γ, V]
        (the drafter's processed probs they were drawn from), p [n, γ+1, V] (the target's at the same
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


class RejectionSampler:
    """Speculative rejection sampling (Leviathan et al. 2023): lossless in distribution.

    `resample_residual=False` draws the replacement from p instead of norm(max(p − q, 0)): that is a
    deliberately *wrong* sampler, kept only so the distribution test can prove it has power.
    """

    def __init__(self, resample_residual: bool = True):
        self.resample_residual = resample_residual

    def verify(self, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, noise: StepNoise,
               draft_ok: torch.Tensor) -> Verdict:
        n, gamma = drafts.shape
        idx = drafts.unsqueeze(-1)
        p_d = p[:, :gamma].gather(-1, idx).squeeze(-1)  # [n, γ]
        q_d = q.gather(-1, idx).squeeze(-1)  # [n, γ]
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
            q_next = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)[rows, accepted_len]  # [n, V]
            q_next = torch.where(rejected[:, None], q_next, 0.0)  # an unused or dropped q (maybe NaN) plays no part
            residual = (p_next - q_next).clamp_min(0)  # q_next = 0 → residual = p
            mass = residual.sum(-1, keepdim=True)
            # Rounding can leave no mass when p ≈ q; then p itself is the right law to sample.
            residual = torch.where(mass > 1e-12, residual / mass.clamp_min(1e-30), p_next)
        token, next_noise = noise.token(), None  # greedy draws no noise
        if token is not None:
            own_draw = token[rows, accepted_len]  # [n, V]
            next_noise = own_draw if gamma == 0 else torch.where(
                rejected[:, None], noise.residual(accepted_len), own_draw)
        next_token = draw(residual, next_noise)  # [n]
        tokens = torch.cat([drafts, drafts.new_zeros(n, 1)], dim=1)  # [n, γ+1]
        tokens.scatter_(1, accepted_len.unsqueeze(1), next_token.unsqueeze(1))
        return Verdict(accepted_len=accepted_len, accepted=accepted, next_token=next_token, tokens=tokens,
                       no_distribution=~p_next.sum(-1).isfinite())


class InvariantSampler:
    """Drafter-invariant speculative sampling (Daliri, Musco, Suresh 2024): the output is plain
    Gumbel-max decoding's for the seed, whatever the drafter proposes."""

    def verify(self, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, noise: StepNoise,
               draft_ok: torch.Tensor) -> Verdict:
        n, gamma = drafts.shape
        tokens = draw(p, noise.token())  # [n, γ+1]: the target's token at every position of the step
        has_p = p.sum(-1).isfinite()  # [n, γ+1]
        # A kept draft equals the target's token, so `tokens` is already the row's kept drafts + next token.
        accepted, accepted_len = _kept_prefix((drafts == tokens[:, :gamma]) & has_p[:, :gamma] & draft_ok)
        rows = torch.arange(n, device=p.device)
        return Verdict(accepted_len=accepted_len, accepted=accepted, next_token=tokens[rows, accepted_len],
                       tokens=tokens, no_distribution=~has_p[rows, accepted_len])


SAMPLERS: dict[str, type[RejectionSampler] | type[InvariantSampler]] = {
    "rejection": RejectionSampler,
    "invariant": InvariantSampler,
}
