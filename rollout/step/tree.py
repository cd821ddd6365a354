"""One engine step over token trees: the drafter proposes a tree per row, the target scores every node in one
forward, the accept rule keeps one root-to-node path, and the caches keep exactly what a chain step would.

The step, for n live rows and a tree of depth D and width w (N = 1 + D·w nodes per row, `sampling.draft_tree`):

1. `TreeDrafter.propose_tree` grows the tree (`drafters.tree_draft`), each node drawn with the token noise of
   its depth (`sampling.noise.StepNoise.draw_top`).
2. One target forward feeds the root (the row's last token) and every node at slots `start .. start + N − 1`
   past the row's cached tokens, each node seeing its context and ancestors at position `start + depth`
   (`models.tree_mask.TreeAttention`) → p at every node [n, N, V].
3. The tree rule (`sampling.tree_accept`: the invariant descent, or recursive rejection sampling over
   siblings) keeps a path of 0..D nodes and draws the token after it.
4. Along the kept path the step is a chain step of γ = D: its logits, p, tokens and tried depths go through the
   stages every step shares (`base.DecodeStep.run`: `core.append.append_kept`, the one device→host copy). Per
   row, "drafted" counts the depths where a candidate was verified on the path, so acceptance reads as it does
   for chains; the nodes verified are counted apart (`EngineStats.tree_nodes`).
5. The kept path's K/V (and the hidden states a feature drafter reads) move into the slots a chain would have
   written (`RaggedKVCache.compact`, dense or paged); then the one writer, `ModelRunner.rollback`, cuts every
   row to its kept length — the other branches' slots are past it, stale and never read. The drafter rolls
   back through its own `keep` (the drafter LM's tree forwards moved no length: its next catch-up feeds the
   kept tokens). Recurrent state cannot branch: trees are refused for such models at construction.

A step of width 1 still runs as a chain step (`chain.ChainStep`): chains keep their path and cost.
"""

from __future__ import annotations

import torch

from ..config import EngineConfig, SamplingParams
from ..core.append import VerifiedStep
from ..core.batch import RowBuffers
from ..core.stats import EngineStats
from ..drafters.protocol import Drafter, TreeDrafter
from ..engine_speculation import StepPlan
from ..models.runner import ModelRunner
from ..models.tree_mask import TreeAttention, check_tree
from ..sampling.logits import process_logits
from ..sampling.noise import StepNoise
from ..sampling.tree_accept import TREE_RULES, TreeVerdict
from .base import DecodeStep, Verified


class TreeStep(DecodeStep):
    """The tree step of one engine (module docstring): its tree drafter and the sampler's tree rule (`rule`)."""

    def __init__(self, target: ModelRunner, drafter: TreeDrafter, stats: EngineStats, vocab_size: int, sampler: str):
        super().__init__(target, drafter, stats, vocab_size)
        self.rule = TREE_RULES[sampler]()

    def _verify(self, rows: RowBuffers, live: slice, seq_len: torch.Tensor, noise: StepNoise, plan: StepPlan,
                params: SamplingParams) -> Verified:
        n, depth = live.stop, plan.depth
        proposal = self.drafter.propose_tree(live, rows, depth, plan.width, params, noise)
        tree = proposal.tree
        usable = tree.valid & proposal.q.finite_rows(n, seq_len.device)[:, None]  # [n, M]
        start = seq_len - 1  # [n] the target caches every token but the last: the root is fed here
        positions = start[:, None] + tree.node_depths(seq_len.device)  # [n, N]
        fed = torch.cat([self.last_tokens(rows, live, seq_len), proposal.drafts], 1)  # [n, N]
        logits = self.target.forward(live, fed, start, hidden=rows.hidden,
                                     host_start=[s - 1 for s in rows.host_seq_len[:n]],
                                     tree=TreeAttention(start, tree.ancestors(), positions, positions))  # [n, N, V]
        p = process_logits(logits, params)  # [n, N, V] fp32
        verdict = self.rule.verify(proposal.drafts, proposal.q, p, noise, tree, usable)
        along = verdict.path[..., None].expand(-1, -1, logits.shape[-1])  # [n, D+1, V]
        # Kept drafts along the path; at the depth where its candidates were rejected no single draft stands.
        drafts = torch.where(verdict.accepted, verdict.tokens[:, :depth], -1)  # [n, D]
        step = VerifiedStep(seq_len, drafts, None, self._source(tree.source, verdict), verdict.tried, verdict,
                            logits.gather(1, along), p.gather(1, along))
        return Verified(step, depth, verdict.tried.sum(1), count_evidence=False)

    def _settle(self, rows: RowBuffers, live: slice, verified: Verified) -> None:
        """The kept path's K/V (and hidden states) into the slots a chain step of γ = depth writes (step 5)."""
        start, path = verified.step.seq_len - 1, verified.step.verdict.path  # [n], [n, D+1]
        slots = start[:, None] + torch.arange(verified.depth + 1, device=start.device)  # [n, D+1] a chain's slots
        self.target.cache.compact(live, start[:, None] + path, slots)
        if rows.hidden is not None:
            hidden = rows.hidden[live]  # [n, L, H], a view
            at = (start[:, None] + path)[..., None].expand(-1, -1, hidden.shape[-1])
            hidden.scatter_(1, slots[..., None].expand_as(at), hidden.gather(1, at))

    @staticmethod
    def _source(source: torch.Tensor | None, verdict: TreeVerdict) -> torch.Tensor | None:
        """[n] the drafter each row-step counts for: the one whose node the path kept first (none kept: the one
        that proposed the first child of the root)."""
        if source is None:
            return None
        first = source.gather(1, (verdict.path[:, 1:2] - 1).clamp_min(0))[:, 0]  # [n]
        return torch.where(verdict.accepted_len > 0, first, source[:, 0])


def make_tree_step(config: EngineConfig, target: ModelRunner, drafter: Drafter | None, stats: EngineStats
                   ) -> TreeStep | None:
    """An engine's tree step, or None for chains. `ValueError` where trees cannot run: a drafter that proposes none,
    a target or drafter with recurrent layers."""
    if config.tree_width == 1 or drafter is None:
        return None
    check_tree(target.model.config.model_type, bool(target.cache.state_layers), "target")
    if not isinstance(drafter, TreeDrafter) or not drafter.tree_ready:
        raise ValueError(f"tree_width={config.tree_width!r} is invalid with drafters {drafter.names}: trees need "
                         "a drafter that grows them: the drafter LM ('model', alone or with 'suffix') without "
                         "recurrent layers, 'eagle', 'eagle3', 'medusa' or 'block'")
    return TreeStep(target, drafter, stats, target.vocab_size, config.sampler)
