"""Draft trees from the heads on the policy's hidden states: EAGLE-2's dynamic tree and Medusa's tree.

Both hand `tree_draft.grow_tree` the q at the root and an `expand` that returns the q of a level's nodes; the tree
(which nodes, each node's children drawn from the q it was given) and the lossless rule are `grow_tree`'s and
`sampling.tree_accept`'s, as for the drafter LM. What differs is where a node's q comes from:

- **EAGLE / EAGLE-3** (`eagle_tree`; Li et al. 2024, arXiv 2406.16858): a node is the pair (its parent's predicted
  feature, its token) fed through the head over the head's own ragged cache, at the position a chain would feed
  it (the row's S − 1 real pairs first, then depth − 1 past them), seeing the row's pairs and its ancestors'
  (a tree mask over the slots the level is written to). Its output's LM-head logits are its children's q. The
  level's K/V are written past the cache's length, which never moves: `EagleDrafter.keep` leaves the S − 1
  real pairs and the next step's catch-up overwrites the tree's slots with the kept path's real pairs.
- **Medusa** (`medusa_tree`; Cai et al. 2024, arXiv 2401.10774): head d reads only the row's newest hidden state,
  so every node at depth d has the same children's q, head d's (past the last head, the last head's). The tree
  is a selection of the heads' top tokens by path confidence, Medusa's tree without its fixed shape.

Greedy decoding ranks children by q at T = 1 and the rule compares tokens only; sampled decoding draws them from
the processed q (temperature, top-k, top-p as the target's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..config import SamplingParams
from ..core.batch import RowBuffers
from ..models.rows import RowIds, Rows, device_index, pick
from ..sampling.logits import process_logits
from ..sampling.noise import StepNoise
from ..sampling.tree import tree_ancestors
from .hidden import last_hidden
from .protocol import Proposal
from .tree_draft import grow_tree

if TYPE_CHECKING:
    from .eagle import EagleDrafter
    from .medusa import MedusaDrafter


def confidence(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """A node's children's q from its logits [..., K] (fp32): T = 1 for greedy ranking, else the processed q."""
    logits = logits.float()
    return logits.softmax(-1) if params.greedy else process_logits(logits, params)


def eagle_tree(drafter: EagleDrafter, live: Rows, rows: RowBuffers, depth: int, width: int, params: SamplingParams,
               noise: StepNoise) -> Proposal:
    index = device_index(live)
    root = drafter.catch_up(live, rows)  # [n, H] the output whose logits draft depth 1
    n, device = root.shape[0], drafter.device
    base, host_base = drafter.cache.lens[index], pick(drafter.cache.host_lens, live)  # [n] S − 1: never moved
    outputs = root.new_zeros(n, depth * width, root.shape[-1])  # [n, D·w, H] each drafted node's head output
    lm_head = drafter.lm_head

    def expand(tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
        offset = (level - 1) * width
        mine = parents[:, offset:]  # [n, w] each node's parent (0: the root)
        features = torch.where((mine == 0)[..., None], root[:, None], outputs.gather(
            1, (mine - 1).clamp_min(0)[..., None].expand(-1, -1, root.shape[-1])))  # [n, w, H]
        slots = drafter.cache.plan_write(live, base + offset, width, host_start=[b + offset for b in host_base])
        kv = torch.arange(drafter.cache.plan.kv_len, device=device)  # [K]
        seen = tree_ancestors(parents, width)[:, 1 + offset :, 1:]  # [n, w, d·w] ancestor-or-self among the drafted
        drafted = kv[None, :] - base[:, None]  # [n, K] which drafted node a slot holds (< 0: the row's pairs)
        in_tree = (drafted >= 0) & (drafted < offset + width)
        sees = seen.gather(2, drafted.clamp(0, offset + width - 1)[:, None].expand(-1, width, -1))  # [n, w, K]
        mask = ((drafted < 0)[:, None] | (in_tree[:, None] & sees))[:, None]  # [n, 1, w, K]
        positions = (base + level - 1)[:, None].expand(-1, width)  # [n, w] where a chain would feed them
        try:
            embeds = drafter.embed(tokens.clamp_max(drafter.max_input_id))
            out = drafter._run_head(embeds, features.to(drafter.head.fc.weight.dtype), positions, mask, False)
        finally:
            drafter.cache.plan = None
            drafter.num_forwards += 1
        del slots
        outputs[:, offset : offset + width] = out
        return confidence(drafter.draws.logits(drafter._draft_input(out), lm_head), params)  # [n, w, K]

    root_q = confidence(drafter.draws.logits(drafter._draft_input(root), lm_head), params)  # [n, K]
    rows_of = live.index if isinstance(live, RowIds) else None
    grown = grow_tree(root_q, depth, width, expand, noise, drafter.draws.ids, rows_of)
    return Proposal(grown.drafts, drafter.draws.proposal_q(grown.probs), tree=grown.tree)


def medusa_tree(drafter: MedusaDrafter, live: Rows, rows: RowBuffers, depth: int, width: int,
                params: SamplingParams, noise: StepNoise) -> Proposal:
    logits = drafter.draws.logits(drafter.heads(last_hidden(rows, live)), drafter.lm_head)  # [n, heads, K]
    drafter.num_forwards += 1
    q = confidence(logits, params)  # [n, heads, K]
    last = drafter.heads.num_heads - 1

    def expand(tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
        return q[:, min(level, last)][:, None].expand(-1, width, -1)  # [n, w, K]: head `level`'s, for every node

    rows_of = live.index if isinstance(live, RowIds) else None
    grown = grow_tree(q[:, 0], depth, width, expand, noise, drafter.draws.ids, rows_of)
    return Proposal(grown.drafts, drafter.draws.proposal_q(grown.probs), tree=grown.tree)
