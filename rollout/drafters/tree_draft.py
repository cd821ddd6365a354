"""Growing a draft tree from a drafter's own confidence (EAGLE-2's dynamic tree, Li et al. 2024, arXiv 2406.16858).

Level by level, each node of the level above offers its children in the order of its q, and a child's score
is its path confidence — the product of q along its path, the drafter's estimate of the chance that the
target keeps the whole path. The `width` best (parent, rank) pairs of the level are expanded: parent a
gets k_a children. Where this departs from EAGLE-2, and why: EAGLE-2 takes each node's top-k tokens by q and
re-ranks every node at the end; the lossless tree rule (`sampling.tree_accept.TreeRejection`) needs each
node's children to be a draw from its q without replacement. So the k_a come from the sorted q values
(known before any token of the level is drawn), and the children themselves are the first k_a of a
Gumbel-top-k draw with the noise of their depth (`StepNoise.draw_top`) — the first of them is the chain's
draft; under greedy decoding the top k_a tokens by q, EAGLE-2's choice. The tree keeps `width` nodes on
every level (no final re-rank): one forward per level, all rows alike.

`grow_tree` is the drafter-independent part: a drafter hands it its q at the root and an `expand` that
returns the q of a level's nodes (one forward of its model over those nodes with a tree mask).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import SamplingParams
from ..sampling.draft_tree import DraftTree
from ..sampling.logits import process_logits
from ..sampling.noise import StepNoise

# expand(tokens [n, w] (target ids), parents [n, d·w] of every node so far, d) → q of the level-d nodes [n, w, K]
Expand = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def confidence(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """A node's children's q from its logits [..., K] (fp32): T = 1 for greedy ranking (the rule then compares
    tokens only), else the processed q (temperature, top-k, top-p as the target's) the children are drawn from."""
    logits = logits.float()
    return logits.softmax(-1) if params.greedy else process_logits(logits, params)


@dataclass
class GrownTree:
    drafts: torch.Tensor  # [n, M] target ids
    probs: torch.Tensor  # [n, M, K] the q each node was drawn from (its parent's)
    tree: DraftTree


def grow_tree(root_q: torch.Tensor, depth: int, width: int, expand: Expand, noise: StepNoise,
              ids: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> GrownTree:
    """A tree of `depth` levels of `width` nodes from q at the root [n, K] (over `ids` [K], or the vocabulary;
    `rows` [n]: the live rows q is for, None: all). See the module docstring."""
    n, size = root_q.shape
    device = root_q.device
    if size < width:
        raise ValueError(f"a tree of width {width} needs at least that many draftable tokens; q has {size}")
    total = depth * width
    drafts = torch.zeros(n, total, dtype=torch.long, device=device)
    probs = torch.zeros(n, total, size, device=device)
    parents = torch.zeros(n, total, dtype=torch.long, device=device)
    fresh = torch.zeros(n, total, dtype=torch.bool, device=device)
    valid = torch.zeros(n, total, dtype=torch.bool, device=device)
    q_level = root_q[:, None]  # [n, a, K]: the q of each node of the level above (a = 1 at the root)
    confidence = torch.ones(n, 1, device=device)  # [n, a] path confidence of those nodes
    parent_ids = torch.zeros(n, 1, dtype=torch.long, device=device)  # [n, a] their node ids
    for level in range(1, depth + 1):
        above = q_level.shape[1]
        ranked = q_level.topk(width, dim=-1).values  # [n, a, w] each parent's best q values
        scores = (confidence[:, :, None] * ranked).nan_to_num(0.0).reshape(n, above * width)
        best = scores.topk(width, dim=-1).indices  # [n, w] the pairs expanded
        ones = torch.ones_like(best, dtype=torch.float)
        counts = torch.zeros(n, above, device=device).scatter_add_(1, best // width, ones)  # [n, a] k_a
        taken = torch.arange(width, device=device)[None, None, :] < counts[:, :, None]  # [n, a, w] rank < k_a
        order = (~taken).reshape(n, -1).to(torch.uint8).argsort(dim=1, stable=True)[:, :width]  # [n, w] a-major
        parent_local, rank = order // width, order % width
        local = noise.draw_top(q_level, level - 1, width, ids, rows).reshape(n, -1).gather(1, order)  # [n, w]
        node_q = q_level.gather(1, parent_local[..., None].expand(-1, -1, size))  # [n, w, K]
        q_x = node_q.gather(2, local[..., None])[..., 0]  # [n, w]
        nodes = slice((level - 1) * width, level * width)
        drafts[:, nodes] = local if ids is None else ids[local]
        probs[:, nodes] = node_q
        parents[:, nodes] = parent_ids.gather(1, parent_local)
        fresh[:, nodes] = rank == 0
        valid[:, nodes] = (q_x > 0) & valid_parent(valid, parents[:, nodes], level)
        confidence = confidence.gather(1, parent_local) * q_x
        parent_ids = torch.arange(nodes.start + 1, nodes.stop + 1, device=device)[None].expand(n, -1)
        if level < depth:
            q_level = expand(drafts[:, nodes], parents[:, : nodes.stop], level)
    return GrownTree(drafts, probs, DraftTree(parents, fresh, valid, width, depth))


def valid_parent(valid: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
    """[n, w] whether each node's parent is a real candidate (the root always is)."""
    if level == 1:
        return torch.ones_like(parents, dtype=torch.bool)
    return valid.gather(1, (parents - 1).clamp_min(0))
