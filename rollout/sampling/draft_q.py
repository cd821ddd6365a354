"""`DraftQ`: the distributions one step's drafts were drawn from, stored as compactly as the drafter knows them.

Verification needs q only at two places: q(d) of each draft (the accept test) and, at a row's first
rejection, q as a whole row (the residual max(p − q, 0)). Neither needs a dense [n, γ, V] tensor, which at
V = 151,936, n = 64, γ = 4 is 156 MB of fp32 per step. So q is kept in one of three forms:

- dense: `probs` [n, γ, V] (`ids` None) — a drafter over the whole vocabulary;
- a draft vocabulary: `probs` [n, γ, N] over the target ids `ids` [N] (sorted, shared by all rows), q = 0
  elsewhere (`drafters.draft_vocab`);
- point masses: rows flagged in `point` [n] have q = onehot(draft) at every position (the suffix drafter); their
  `probs` rows are ignored. `probs` is None when every row is a point mass. A tree mixing drafters flags single
  positions instead: `point` [n, γ] (a suffix continuation's nodes beside a model's, `drafters.suffix_or_model`).

Rows of different forms mix (the per-row choice between the suffix and a model drafter): point rows beside
dense or draft-vocabulary rows. NaN in a non-point row's probs means the drafter had no distribution there:
`finite_rows` is False for it and the engine drops its drafts for the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftQ:
    probs: torch.Tensor | None  # [n, γ, K] fp32: K = V (ids None) or K = N over `ids`; None: all point masses
    ids: torch.Tensor | None  # [N] int64, sorted target ids of a draft vocabulary; None: probs span the vocabulary
    point: torch.Tensor | None  # [n] (or [n, γ]) bool: rows (positions) whose q is a point mass at their drafts
    vocab_size: int

    @classmethod
    def over(cls, probs: torch.Tensor, ids: torch.Tensor | None, vocab_size: int) -> DraftQ:
        """probs [n, γ, K] over `ids` [K] (None: K = vocab_size, the whole vocabulary)."""
        return cls(probs, ids, None, vocab_size)

    @classmethod
    def points(cls, rows: int, vocab_size: int, device: torch.device) -> DraftQ:
        """Every row a point mass at its drafts."""
        return cls(None, None, torch.ones(rows, dtype=torch.bool, device=device), vocab_size)

    @property
    def width(self) -> int | None:
        """γ of `probs` (None when every row is a point mass: the drafts tensor has it)."""
        return None if self.probs is None else self.probs.shape[1]

    def narrow(self, width: int) -> DraftQ:
        """The first `width` draft positions."""
        probs = None if self.probs is None else self.probs[:, :width]
        return DraftQ(probs, self.ids, self.point, self.vocab_size)

    def finite_rows(self, rows: int, device: torch.device) -> torch.Tensor:
        """[n] bool: rows whose q is a distribution at every position (point masses always are)."""
        if self.probs is None:
            return torch.ones(rows, dtype=torch.bool, device=device)
        finite = self.probs.sum(-1).isfinite()  # [n, γ]
        if self.point is not None and self.point.dim() == 2:
            return (finite | self.point).all(1)
        ok = finite.all(1)  # [n]
        return ok if self.point is None else ok | self.point

    def of(self, drafts: torch.Tensor) -> torch.Tensor:
        """q(d) of every draft [n, γ] → [n, γ] (1 for point rows; 0 for a draft outside the draft vocabulary,
        which a row drawn from q never proposes)."""
        if self.probs is None:
            return torch.ones(drafts.shape, dtype=torch.float32, device=drafts.device)
        if self.ids is None:
            value = self.probs.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        else:
            pos = torch.searchsorted(self.ids, drafts).clamp_max(self.ids.shape[0] - 1)  # [n, γ]
            value = self.probs.gather(-1, pos.unsqueeze(-1)).squeeze(-1)
            value = torch.where(self.ids[pos] == drafts, value, 0.0)
        return value if self.point is None else torch.where(self._point_at(drafts), 1.0, value)

    def _point_at(self, drafts: torch.Tensor) -> torch.Tensor:
        """[n, γ] bool: the point-mass positions (`point` broadcast over positions when it flags rows)."""
        return self.point[:, None].expand(drafts.shape) if self.point.dim() == 1 else self.point

    def row(self, drafts: torch.Tensor, col: torch.Tensor, use: torch.Tensor) -> torch.Tensor:
        """Dense q [n, V] of each row at draft position `col` [n] (clamped to γ − 1), zero where `use` [n] is False
        (an unused q, maybe NaN, plays no part)."""
        n = drafts.shape[0]
        rows = torch.arange(n, device=drafts.device)
        col = col.clamp_max(max(drafts.shape[1] - 1, 0))
        out = torch.zeros(n, self.vocab_size, device=drafts.device)
        point = None if self.point is None else self.point if self.point.dim() == 1 else self.point[rows, col]  # [n]
        if self.probs is not None:
            at = self.probs[rows, col]  # [n, K]
            at = torch.where(use[:, None], at, 0.0)
            if point is not None:
                at = torch.where(point[:, None], 0.0, at)
            if self.ids is None:
                out = at.clone()
            else:
                out[:, self.ids] = at
        if point is not None:
            hot = (point & use).float()  # [n]
            out.scatter_add_(1, drafts[rows, col][:, None], hot[:, None])
        return out

    def select(self, index: torch.Tensor, rows: int) -> DraftQ:
        """A q for `rows` rows whose rows `index` [k] are this q's rows, in order, and every other row a point mass
        (the per-row choice: the model's q for the rows it served, point masses for the suffix's)."""
        point = torch.ones(rows, dtype=torch.bool, device=index.device)
        point[index] = False if self.point is None else self.point
        if self.probs is None:
            return DraftQ(None, None, point, self.vocab_size)
        probs = self.probs.new_zeros(rows, *self.probs.shape[1:])
        probs[index] = self.probs
        return DraftQ(probs, self.ids, point, self.vocab_size)

    def expanded(self, drafts: torch.Tensor) -> torch.Tensor:
        """The dense [n, γ, V] q (tests, debugging; verification never builds it)."""
        gamma = drafts.shape[1]
        return torch.stack([self.row(drafts, torch.full((drafts.shape[0],), i, device=drafts.device),
                                     torch.ones(drafts.shape[0], dtype=torch.bool, device=drafts.device))
                            for i in range(gamma)], 1) if gamma else torch.zeros(drafts.shape[0], 0, self.vocab_size)
