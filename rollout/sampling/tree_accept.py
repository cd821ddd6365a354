"""Accept rules over a tree of drafts (`draft_tree.DraftTree`): which root-to-node path the target keeps.

Both descend the tree level by level from the root. At the current node c (depth d − 1, the target's p_c
known from the one tree forward) they decide among c's children, keep at most one, and stop at the first
level where none is kept; the token after the kept path is drawn there. Notation as in `accept`: p the target's
processed distribution, q the drafter's.

- `TreeInvariant` (with `sampler="invariant"`, and for greedy decoding under either sampler): the target's
  token at c is its Gumbel-max draw argmax(log p_c + g) with the noise of that sequence position — the token
  plain decoding draws there — and the child equal to it, if any, is kept. The emitted tokens are plain
  decoding's for the seed whatever the tree (Daliri, Musco, Suresh 2024's coupling, applied at every node).
- `TreeRejection` (with `sampler="rejection"`): recursive rejection sampling over the siblings — SpecInfer's
  multi-step speculative sampling (Miao et al. 2023, arXiv 2305.09781, Algorithm 2), in its form for siblings
  drawn *without replacement* (Sequoia, Chen et al. 2024, arXiv 2402.12374, Algorithm 3). Children x_1..x_k of c
  are tried in order: x_i is kept with probability min(1, r_i(x_i) / q_i(x_i)), where r_1 = p_c and, after a
  rejection, r_{i+1} = norm(max(r_i − q_i, 0)); q_i is the law x_i was drawn from — its own q for a fresh node,
  and q with the earlier siblings of its draw removed and renormalised for one drawn without replacement
  (Gumbel-top-k). If every child is rejected the token is drawn from the last residual (with residual noise);
  a node without children emits the target's own draw. Lossless by induction over the siblings: given x_i ~ q_i,
  the step emits y with probability min(r_i, q_i)(y) + (1 − Σ min(r_i, q_i)) r_{i+1}(y) = r_i(y), and what
  comes after depends on x_i only through q_{i+1}, for which the same holds. Children from different drafters
  (a suffix continuation, then a model's draws) are separate fresh draws and chain the same way.
  `update_residual=False` keeps r = p_c for every sibling: a deliberately *wrong* rule, kept only so the
  distribution test can show it has power.

Randomness: the i-th sibling tried at a position draws its u from (request, position, i)
(`Purpose.SIBLING_ACCEPT`); the residual and the own draw use that position's residual and token noise, as a chain
step does, so a tree of width 1 keeps the same law (not the same tokens as the chain rule: other uniforms).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .accept import Verdict
from .draft_q import DraftQ
from .draft_tree import DraftTree
from .noise import StepNoise, gumbel_max


@dataclass
class TreeVerdict(Verdict):
    """A `Verdict` along the kept path (depth D levels: `accepted`, `tokens` as a chain step of γ = D has them),
    and the path itself."""

    path: torch.Tensor | None = None  # [n, D + 1] node ids of the kept path, root first (past its end: 0)
    tried: torch.Tensor | None = None  # [n, D] bool: a candidate was verified at that depth of the path


class _Descent:
    """What the level-by-level walk holds per row: the current node, whether it still descends, the path."""

    def __init__(self, n: int, depth: int, device: torch.device):
        self.node = torch.zeros(n, dtype=torch.long, device=device)  # [n] current node
        self.alive = torch.ones(n, dtype=torch.bool, device=device)  # [n] every level so far kept a child
        self.path = torch.zeros(n, depth + 1, dtype=torch.long, device=device)  # [n, D+1]
        self.kept = torch.zeros(n, dtype=torch.long, device=device)  # [n] levels kept
        self.tried_last = torch.zeros(n, dtype=torch.bool, device=device)  # [n] a child was tried where it stopped

    def children(self, tree: DraftTree, usable: torch.Tensor, j: int) -> torch.Tensor:
        """[n] bool: drafted node j is a usable child of each live row's current node."""
        return self.alive & (tree.parents[:, j] == self.node) & usable[:, j]

    def advance(self, level: int, chosen: torch.Tensor, tried: torch.Tensor) -> torch.Tensor:
        """Take `chosen` [n] (−1: none kept) at `level`; returns the rows that stop here."""
        kept = chosen >= 0
        stop = self.alive & ~kept
        self.tried_last = torch.where(stop, tried, self.tried_last)
        self.alive = self.alive & kept
        self.node = torch.where(self.alive, chosen, self.node)
        self.path[:, level] = torch.where(self.alive, chosen, 0)
        self.kept += self.alive.long()
        return stop

    def verdict(self, drafts: torch.Tensor, next_token: torch.Tensor, no_distribution: torch.Tensor,
                depth: int) -> TreeVerdict:
        n = drafts.shape[0]
        levels = torch.arange(depth, device=drafts.device)  # [D]
        accepted = levels[None, :] < self.kept[:, None]  # [n, D]
        padded = torch.cat([drafts.new_zeros(n, 1), drafts], 1)  # [n, N]: node ids index it
        tokens = torch.cat([padded.gather(1, self.path[:, 1:]), drafts.new_zeros(n, 1)], 1)  # [n, D+1]
        tokens.scatter_(1, self.kept[:, None], next_token[:, None])
        tried = accepted | ((levels[None, :] == self.kept[:, None]) & self.tried_last[:, None])
        return TreeVerdict(accepted_len=self.kept, accepted=accepted, next_token=next_token, tokens=tokens,
                           no_distribution=no_distribution, path=self.path, tried=tried)


class TreeInvariant:
    """Keep the child equal to the target's Gumbel-max token at each node (greedy: its argmax)."""

    def verify(self, drafts: torch.Tensor, q: DraftQ, p: torch.Tensor, noise: StepNoise, tree: DraftTree,
               usable: torch.Tensor) -> TreeVerdict:
        """drafts [n, M], p [n, N, V] at every node, `usable` [n, M] bool (the candidates that may be kept)."""
        n, width, depth = drafts.shape[0], tree.width, tree.depth
        walk = _Descent(n, depth, drafts.device)
        rows = torch.arange(n, device=drafts.device)
        has_p = p.sum(-1).isfinite()  # [n, N]
        next_token = torch.zeros(n, dtype=torch.long, device=drafts.device)
        for level in range(1, depth + 2):
            if noise.by_row:  # [n] plain decoding's token where a row still descends (0 elsewhere: not read)
                target = torch.zeros(n, dtype=torch.long, device=drafts.device)
                live = walk.alive.nonzero()[:, 0]
                if not len(live):
                    break
                target[live] = gumbel_max(p[live, walk.node[live]], noise.token_rows(level - 1, live))
            else:
                target = gumbel_max(p[rows, walk.node], noise.token_row(level - 1))  # [n] plain decoding's token
            if level > depth:  # every level kept a child: the bonus token
                next_token = torch.where(walk.alive, target, next_token)
                break
            chosen = torch.full((n,), -1, dtype=torch.long, device=drafts.device)
            tried = torch.zeros(n, dtype=torch.bool, device=drafts.device)
            for j in range((level - 1) * width, level * width):
                child = walk.children(tree, usable, j) & has_p[rows, walk.node]
                chosen = torch.where(child & (chosen < 0) & (drafts[:, j] == target), j + 1, chosen)
                tried |= child
            next_token = torch.where(walk.advance(level, chosen, tried), target, next_token)
        return walk.verdict(drafts, next_token, ~has_p[rows, walk.node], depth)


class TreeRejection:
    """Recursive rejection sampling over siblings (SpecInfer / Sequoia; module docstring): lossless in distribution."""

    def __init__(self, update_residual: bool = True):
        self.update_residual = update_residual

    def verify(self, drafts: torch.Tensor, q: DraftQ, p: torch.Tensor, noise: StepNoise, tree: DraftTree,
               usable: torch.Tensor) -> TreeVerdict:
        if noise.greedy:  # one-hot p and q: keep the child equal to the argmax, the invariant rule's walk
            return TreeInvariant().verify(drafts, q, p, noise, tree, usable)
        n, width, depth = drafts.shape[0], tree.width, tree.depth
        device = drafts.device
        walk = _Descent(n, depth, device)
        rows = torch.arange(n, device=device)
        has_p = p.sum(-1).isfinite()  # [n, N]
        final = p[:, 0].clone()  # [n, V] the law each row's next token is drawn from
        for level in range(1, depth + 1):
            residual = p[rows, walk.node]  # [n, V] r_1 = p_c
            taken = torch.zeros_like(residual, dtype=torch.bool)  # [n, V] earlier siblings of the current draw
            u = noise.sibling_uniform(level - 1, width)  # [n, w]
            chosen = torch.full((n,), -1, dtype=torch.long, device=device)
            tried = torch.zeros(n, dtype=torch.bool, device=device)
            for i, j in enumerate(range((level - 1) * width, level * width)):
                child = walk.children(tree, usable, j) & has_p[rows, walk.node] & (chosen < 0)  # [n]
                x = drafts[:, j : j + 1]  # [n, 1]
                taken &= ~tree.fresh[:, j : j + 1]
                q_i = q.row(drafts, torch.full((n,), j, device=device), child).masked_fill(taken, 0.0)  # [n, V]
                q_i = q_i / q_i.sum(-1, keepdim=True).clamp_min(1e-30)
                # u < r/q written without the division; q_i(x) > 0 for a drawn x.
                keep = child & (u[:, i] * q_i.gather(1, x)[:, 0] < residual.gather(1, x)[:, 0])
                chosen = torch.where(keep, j + 1, chosen)
                if self.update_residual:
                    rest = (residual - q_i).clamp_min(0.0)
                    mass = rest.sum(-1, keepdim=True)
                    # Rounding can leave no mass when r ≈ q; then r itself is the right law.
                    rest = torch.where(mass > 1e-12, rest / mass.clamp_min(1e-30), residual)
                    residual = torch.where((child & ~keep)[:, None], rest, residual)
                taken |= torch.zeros_like(taken).scatter_(1, x, child[:, None])
                tried |= child
            stop = walk.advance(level, chosen, tried)
            final = torch.where(stop[:, None], residual, final)
        final = torch.where(walk.alive[:, None], p[rows, walk.node], final)  # the bonus token's law
        own, resampled = noise.token_at(walk.kept), noise.residual(walk.kept)
        next_token = gumbel_max(final, torch.where(walk.tried_last[:, None], resampled, own))
        return walk.verdict(drafts, next_token, ~final.sum(-1).isfinite(), depth)


TREE_RULES: dict[str, type[TreeRejection] | type[TreeInvariant]] = {  # `EngineConfig.sampler` → tree rule
    "rejection": TreeRejection,
    "invariant": TreeInvariant,
}
