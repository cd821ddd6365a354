"""Gumbel-max draws, and where one engine step's noise comes from.

Every token is drawn by Gumbel-max, argmax(log π + g), with noise g of its (request, position) from
`randomness` — never of the step, slot or batch it was drawn in. `StepNoise` hands out one step's noise:
the token noise of each position (shared by the drafter's draft and the target's own draw there), and the
rejection rule's accept uniforms and residual noise (`accept`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .randomness import Purpose, gumbel, uniform


def gumbel_max(probs: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """Gumbel-max: one token per distribution, argmax(log probs + noise), `probs` [..., V] → ids [...].

    `noise` None (greedy) takes the argmax. Zero-probability tokens are never drawn (log 0 = −inf). A NaN
    row (no distribution, see `logits.process_logits`) gives some id instead of raising; callers discard such
    draws (`accept.Verdict.no_distribution`, the engine's check of q).
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

    def draw_draft(self, q: torch.Tensor, i: int, ids: torch.Tensor | None = None,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
        """Draft i [n] from the drafter's processed q [n, V], with the token noise of its position.

        `ids` [N]: q [n, N] is over those target ids (a draft vocabulary) and the draft is the one of them
        Gumbel-max picks with their noise — the draw a q zero elsewhere would give. `rows` [n]: q is for
        those live rows only (each keeps its own row's noise)."""
        token = self.token()
        noise = None if token is None else token[:, i] if rows is None else token[rows, i]  # [n, V]
        if ids is None:
            return gumbel_max(q, noise)
        return ids[gumbel_max(q, None if noise is None else noise[:, ids])]

    def residual(self, offset: torch.Tensor) -> torch.Tensor | None:
        """Residual noise [n, V] at each row's position start + offset [n] (`Purpose.RESIDUAL`)."""
        if self.greedy:
            return None
        return gumbel(self.keys, (self.start + offset)[:, None], Purpose.RESIDUAL, self.vocab_size)[:, 0]

    def uniform(self, count: int, purpose: Purpose) -> torch.Tensor:
        """One uniform [n, count] at each of the first `count` positions of the step."""
        offsets = torch.arange(count, device=self.start.device)  # [count]
        return uniform(self.keys, self.start[:, None] + offsets, purpose)
