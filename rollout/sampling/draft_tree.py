"""`DraftTree`: several candidate continuations of each row, as one tree of draft tokens.

Node 0 is the root — the row's last token, which the target has not cached yet — and the drafted nodes
1..M follow level by level: `width` nodes at each of `depth` levels (M = width · depth), a node's parent
always at the level above (0 for the first level). Siblings — the children of one node — sit next to each
other in the order the accept rule tries them (`tree_accept`). A chain is the tree of width 1.

`fresh` says how each node was drawn. A fresh node starts a draw of its own from its q (the
distribution stored with it in the proposal's `DraftQ`). A node that is not fresh was drawn from the same q
*without replacement* after the siblings just before it, back to the last fresh one — the k children of a
drafter LM's node are a Gumbel-top-k draw (`noise.StepNoise.draw_top`): k draws without replacement, the first
of them the chain's draft. The lossless accept rule needs exactly this to know each sibling's law.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """The tree shape of a proposal's drafts [n, M] (`drafters.protocol.Proposal.tree`)."""

    parents: torch.Tensor  # [n, M] int64: each drafted node's parent (0 = the root, j + 1 = drafted node j)
    fresh: torch.Tensor  # [n, M] bool: a draw of its own (False: without replacement after the siblings before it)
    valid: torch.Tensor  # [n, M] bool: a real candidate (False: padding, never kept)
    width: int
    depth: int
    source: torch.Tensor | None = None  # [n, M] which of the drafter's `names` proposed each node (None: the first)

    @property
    def num_nodes(self) -> int:
        """Nodes the target scores per row: the root and every drafted node."""
        return 1 + self.width * self.depth

    def node_depths(self, device: torch.device) -> torch.Tensor:
        """[N] each node's depth (the root's 0)."""
        drafted = torch.arange(self.width * self.depth, device=device) // self.width + 1
        return torch.cat([drafted.new_zeros(1), drafted])

    def ancestors(self) -> torch.Tensor:
        """[n, N, N] bool: node i sees node j (j is i or one of its ancestors; every node sees the root)."""
        return tree_ancestors(self.parents, self.width)


def tree_ancestors(parents: torch.Tensor, width: int) -> torch.Tensor:
    """[n, N, N] ancestor-or-self of the first N - 1 = parents.shape[1] drafted nodes and the root, level by level
    (a parent's row is complete before its children's are made)."""
    n, drafted = parents.shape
    size = drafted + 1
    rows = torch.arange(n, device=parents.device)[:, None]  # [n, 1]
    seen = torch.zeros(n, size, size, dtype=torch.bool, device=parents.device)
    seen[:, 0, 0] = True
    for lo in range(0, drafted, width):
        nodes = torch.arange(lo + 1, min(lo + width, drafted) + 1, device=parents.device)  # [w]
        seen[:, nodes] = seen[rows, parents[:, nodes - 1]]  # [n, w, N]: each node sees what its parent sees
        seen[:, nodes, nodes] = True
    return seen
