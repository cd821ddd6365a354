"""Gumbel-max draws, and where one engine step's noise comes from.

Every token is drawn by Gumbel-max, argmax(log π + g), with noise g of its (request, position) from
`randomness` — never of the step, slot or batch it was drawn in. `StepNoise` hands out one step's noise:
the token noise of each position (shared by the drafter's draft and the target's own draw there), and the
rejection rule's accept uniforms and residual noise (`accept`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .randomness import Purpose, gumbel, uniform

# Where a step hashes a position's token noise only for the rows that read it (`StepNoise.by_row`): on a CPU,
# where choosing the rows costs nothing; an accelerator hashes every row (choosing would sync the host).
DRAW_ONLY_WHAT_IS_READ = frozenset({"cpu"})
MAX_SIBLINGS = 64  # siblings per position with their own accept uniform (`EngineConfig.max_tree_width` is below)


def gumbel_max(probs: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """Gumbel-max: one token per distribution, argmax(log probs + noise), `probs` [..., V] → ids [...].

    `noise` None (greedy) takes the argmax. Zero-probability tokens are never drawn (log 0 = −inf). A NaN
    row (no distribution, see `logits.process_logits`) gives some id instead of raising; callers discard such
    draws (`accept.Verdict.no_distribution`, the engine's check of q).
    """
    if noise is None:
        return probs.argmax(-1)
    return probs.log().add_(noise).argmax(-1)  # one [.., V] temporary


@dataclass
class StepNoise:
    """Where one step's random numbers come from: the live rows' request keys [n], the sequence position
    of each row's first new token [n], and the step's width γ + 1. Greedy steps draw none.

    The token noise of a position is one [n, V] row, computed when first asked for the whole vocabulary and kept
    for the step (the drafter's draw at position i and the invariant rule's verification share it); a draft over a
    draft vocabulary asks only its N columns, and the rejection rule only each row's own position
    (`token_at`): at V = 151,936 the noise is a sampled step's dearest tensor op on a CPU, so a step computes no
    column it does not read."""

    keys: torch.Tensor
    start: torch.Tensor
    width: int
    vocab_size: int
    greedy: bool
    _rows: dict[int, torch.Tensor] = field(default_factory=dict)  # position offset -> [n, V] token noise

    def narrow(self, width: int) -> StepNoise:
        """The same step's noise for its first `width` positions (a proposal narrower than asked)."""
        rows = {i: row for i, row in self._rows.items() if i < width}
        return StepNoise(self.keys, self.start, width, self.vocab_size, self.greedy, rows)

    def token_row(self, i: int) -> torch.Tensor | None:
        """The token noise [n, V] of every live row at position start + i (`Purpose.TOKEN`), computed once."""
        if self.greedy:
            return None
        if i not in self._rows:
            self._rows[i] = gumbel(self.keys, (self.start + i)[:, None], Purpose.TOKEN, self.vocab_size)[:, 0]
        return self._rows[i]

    @property
    def by_row(self) -> bool:
        """Whether the accept rules ask a position's noise only for the rows still keeping drafts (`token_rows`):
        sampled steps on a device that is the host. The hash is a sampled step's dearest op on a CPU (a [rows, V]
        hash per position: 47 ms for 12 rows × 7 positions at V = 32,768 against a 190 ms forward)."""
        return not self.greedy and self.keys.device.type in DRAW_ONLY_WHAT_IS_READ

    def token_rows(self, i: int, rows: torch.Tensor) -> torch.Tensor:
        """The token noise [m, V] at position start + i of the live rows `rows` [m] only: taken from the step's row
        when computed already, else computed for those rows alone (the same values: the noise of a (request,
        position) does not depend on who else is drawn). Not for greedy steps."""
        if i in self._rows:
            return self._rows[i][rows]
        return gumbel(self.keys[rows], (self.start[rows] + i)[:, None], Purpose.TOKEN, self.vocab_size)[:, 0]

    def token_at(self, offset: torch.Tensor) -> torch.Tensor | None:
        """The token noise [n, V] of each row at its own position start + offset [n]: picked from the rows already
        computed when the step has them all, else computed for those positions alone (one row's cost)."""
        if self.greedy:
            return None
        if all(i in self._rows for i in range(self.width)):
            out = self._rows[0]
            for i in range(1, self.width):
                out = torch.where((offset == i)[:, None], self._rows[i], out)
            return out
        return gumbel(self.keys, (self.start + offset)[:, None], Purpose.TOKEN, self.vocab_size)[:, 0]

    def draw_draft(self, q: torch.Tensor, i: int, ids: torch.Tensor | None = None,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
        """Draft i [n] from the drafter's processed q [n, V], with the token noise of its position.

        `ids` [N]: q [n, N] is over those target ids (a draft vocabulary) and the draft is the one of them
        Gumbel-max picks with their noise — the draw a q zero elsewhere would give. `rows` [n]: q is for
        those live rows only (each keeps its own row's noise)."""
        if self.greedy:
            return gumbel_max(q, None) if ids is None else ids[gumbel_max(q, None)]
        if ids is None or i in self._rows:
            noise = self.token_row(i)
            noise = noise if rows is None else noise[rows]
            return gumbel_max(q, noise) if ids is None else ids[gumbel_max(q, noise[:, ids])]
        keys, start = (self.keys, self.start) if rows is None else (self.keys[rows], self.start[rows])
        noise = gumbel(keys, (start + i)[:, None], Purpose.TOKEN, self.vocab_size, ids)[:, 0]  # [n, N]
        return ids[gumbel_max(q, noise)]

    def draw_top(self, q: torch.Tensor, i: int, k: int, ids: torch.Tensor | None = None,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
        """Gumbel-top-k at draft position i: the k largest of log q + g for q [n, a, K] (a distributions per row,
        over `ids` [K] or the vocabulary) → [n, a, k] indices into K, best first. A draw of k without replacement
        (Vieira's Gumbel-top-k trick); the first is `draw_draft`'s draw. Greedy: the top k of q itself.
        `rows` [n]: q is for those live rows only."""
        k = min(k, q.shape[-1])
        if self.greedy:
            return q.topk(k, dim=-1).indices
        noise = self.token_row(i)
        noise = noise if rows is None else noise[rows]
        noise = noise if ids is None else noise[:, ids]  # [n, K]
        return (q.log() + noise[:, None, :]).topk(k, dim=-1).indices

    def sibling_uniform(self, offset: int, count: int) -> torch.Tensor:
        """[n, count]: the tree rule's u for the first `count` siblings tried at position start + offset."""
        position = (self.start + offset)[:, None] * MAX_SIBLINGS + torch.arange(count, device=self.start.device)
        return uniform(self.keys, position, Purpose.SIBLING_ACCEPT)

    def residual(self, offset: torch.Tensor) -> torch.Tensor | None:
        """Residual noise [n, V] at each row's position start + offset [n] (`Purpose.RESIDUAL`)."""
        if self.greedy:
            return None
        return gumbel(self.keys, (self.start + offset)[:, None], Purpose.RESIDUAL, self.vocab_size)[:, 0]

    def uniform(self, count: int, purpose: Purpose) -> torch.Tensor:
        """One uniform [n, count] at each of the first `count` positions of the step."""
        offsets = torch.arange(count, device=self.start.device)  # [count]
        return uniform(self.keys, self.start[:, None] + offsets, purpose)

