"""One engine step over token trees: the drafter proposes a tree per row, the target scores every node in one
forward, the accept rule keeps one root-to-node path, and the caches keep exactly what a chain step would.

The step, for n live rows and a tree of depth D and width w (N = 1 + D·w nodes per row, `sampling.tree`):

1. `TreeDrafter.propose_tree` grows the tree (`drafters.tree_draft`), each node drawn with the token noise of
   its depth (`sampling.noise.StepNoise.draw_top`).
2. One target forward feeds the root (the row's last token) and every node at slots `start .. start + N − 1`
   past the row's cached tokens, each node seeing its context and ancestors at position `start + depth`
   (`models.tree_mask.TreeAttention`) → p at every node [n, N, V].
3. The tree rule (`sampling.tree_accept`: the invariant descent, or recursive rejection sampling over
   siblings) keeps a path of 0..D nodes and draws the token after it.
4. Along the kept path the step is a chain step of γ = D: its logits, p, tokens and tried depths go through
   `core.append.append_kept` unchanged (the one device→host copy). Per row, "drafted" counts the depths where a
   candidate was verified on the path, so acceptance reads as it does for chains; the nodes verified are
   counted apart (`EngineStats.tree_nodes`).
5. The kept path's K/V (and the hidden states a feature drafter reads) move into the slots a chain would have
   written (`RaggedKVCache.compact`, dense or paged); then the one writer, `ModelRunner.rollback`, cuts every
   row to its kept length — the other branches' slots are past it, stale and never read. The drafter rolls
   back through its own `keep` (the drafter LM's tree forwards moved no length: its next catch-up feeds the
   kept tokens). Recurrent state cannot branch: trees are refused for such models at construction.

A step of width 1 still runs as a chain step (`SpecEngine._step`): chains keep their path and cost.
"""

from __future__ import annotations

import torch

from .config import EngineConfig, SamplingParams
from .core.append import VerifiedStep, append_kept
from .core.batch import RowBuffers
from .core.stats import StepSummary
from .drafters.protocol import Drafter, TreeDrafter
from .gamma.factory import make_tree_policy
from .gamma.policy import GammaPolicy
from .gamma.tree import AutoWidth, FixedWidth
from .models.runner import ModelRunner
from .models.tree_mask import TreeAttention, check_tree
from .sampling.logits import process_logits
from .sampling.noise import StepNoise
from .sampling.tree_accept import TREE_RULES, TreeVerdict


class TreeStep:
    """The tree step for one engine (module docstring): its target, its tree drafter and the sampler's tree rule."""

    def __init__(self, target: ModelRunner, drafter: TreeDrafter, sampler: str, vocab_size: int):
        self.target, self.drafter = target, drafter
        self.rule = TREE_RULES[sampler]()
        self.vocab_size = vocab_size

    def run(self, rows: RowBuffers, n: int, depth: int, width: int, params: SamplingParams,
            stop_ids: torch.Tensor) -> StepSummary:
        """One step of the first n rows; returns its summary (`StepSummary.finished`: the rows that ended)."""
        live = slice(0, n)
        seq_len = rows.seq_len[live].clone()  # [n] a copy: `append_kept` moves rows.seq_len
        noise = StepNoise(rows.keys[live], seq_len, depth + 1, self.vocab_size, params.greedy)
        proposal = self.drafter.propose_tree(live, rows, depth, width, params, noise)
        tree = proposal.tree
        usable = tree.valid & proposal.q.finite_rows(n, seq_len.device)[:, None]  # [n, M]
        start = seq_len - 1  # [n] the target caches every token but the last: the root is fed here
        positions = start[:, None] + tree.node_depths(seq_len.device)  # [n, N]
        last_token = rows.tokens[live].gather(1, start[:, None])  # [n, 1]
        logits = self.target.forward(live, torch.cat([last_token, proposal.drafts], 1), start, hidden=rows.hidden,
                                     host_start=[s - 1 for s in rows.host_seq_len[:n]],
                                     tree=TreeAttention(start, tree.ancestors(), positions, positions))  # [n, N, V]
        p = process_logits(logits, params)  # [n, N, V] fp32
        verdict = self.rule.verify(proposal.drafts, proposal.q, p, noise, tree, usable)
        along = verdict.path[..., None].expand(-1, -1, logits.shape[-1])  # [n, D+1, V]
        # Kept drafts along the path; at the depth where its candidates were rejected no single draft stands.
        drafts = torch.where(verdict.accepted, verdict.tokens[:, :depth], -1)  # [n, D]
        step = VerifiedStep(seq_len, drafts, None, self._source(tree.source, verdict), verdict.tried, verdict,
                            logits.gather(1, along), p.gather(1, along))
        summary = append_kept(rows, live, step, params, stop_ids, self.drafter.names, count_evidence=False)
        slots = start[:, None] + torch.arange(depth + 1, device=start.device)  # [n, D+1] a chain's slots
        self.target.cache.compact(live, start[:, None] + verdict.path, slots)
        if rows.hidden is not None:
            hidden = rows.hidden[live]  # [n, L, H], a view
            at = (start[:, None] + verdict.path)[..., None].expand(-1, -1, hidden.shape[-1])
            hidden.scatter_(1, slots[..., None].expand_as(at), hidden.gather(1, at))
        self.target.rollback(live, rows.seq_len[live] - 1, [length - 1 for length in rows.host_seq_len[:n]])
        self.drafter.keep(live, rows, seq_len, verdict.accepted_len, verdict.tried.sum(1))
        return summary

    @staticmethod
    def _source(source: torch.Tensor | None, verdict: TreeVerdict) -> torch.Tensor | None:
        """[n] the drafter each row-step counts for: the one whose node the path kept first (none kept: the one
        that proposed the first child of the root)."""
        if source is None:
            return None
        first = source.gather(1, (verdict.path[:, 1:2] - 1).clamp_min(0))[:, 0]  # [n]
        return torch.where(verdict.accepted_len > 0, first, source[:, 0])


def make_tree_step(config: EngineConfig, target: ModelRunner, drafter: Drafter | None, gamma_policy: GammaPolicy
                   ) -> tuple[TreeStep | None, FixedWidth | AutoWidth | None]:
    """An engine's tree step and tree shape policy (`gamma.tree`), or (None, None) for chains. `ValueError` where
    trees cannot run: a drafter that proposes none, a target or drafter with recurrent layers."""
    if config.tree_width == 1 or drafter is None:
        return None, None
    check_tree(target.model.config.model_type, bool(target.cache.state_layers), "target")
    if not isinstance(drafter, TreeDrafter) or not drafter.tree_ready:
        raise ValueError(f"tree_width={config.tree_width!r} is invalid with drafters {drafter.names}: trees need "
                         "a drafter that grows them: the drafter LM ('model', alone or with 'suffix') without "
                         "recurrent layers, 'eagle', 'eagle3', 'medusa' or 'block'")
    return TreeStep(target, drafter, config.sampler, target.vocab_size), make_tree_policy(config, gamma_policy)
