"""SuffixOrModelDrafter: the suffix drafter and one model drafter serving one batch, chosen per row and step.

Each step the suffix drafter looks up every live row (host work, no model). A row takes the suffix
proposal when its expected kept drafts — from the match length and that length's running acceptance
(`SuffixDrafter.expected_accepted`) — reach the model drafter's (its running per-position acceptance
α_j: Σ_k Π_{j≤k} α_j); otherwise the model's. The model drafter runs only for the rows that take it
(an index-tensor forward over those rows of its cache; none at all when every row takes the suffix),
so its cost follows its share. Rows it skipped fall behind in its cache and catch up in its next
forward. All rows are still verified in one target forward of γ + 1 tokens: a suffix proposal
shorter than γ is padding past its `lengths` (verified, never kept — the price of one forward).

A tree step (`propose_tree`) takes both drafters' proposals at once instead of choosing: at every level first the
nodes of up to `SUFFIX_BRANCHES` suffix continuations with distinct first tokens (siblings and history disagree:
`suffix_index.CompletionIndex.lookup_several`), then the model's tree of the remaining width (`TreeDrafter`);
the tree rule tries the suffix's drafts, then the model's draws, as separate draws (`sampling.tree_accept`).

`factory.make_drafter` builds it when `EngineConfig.drafters` lists "suffix" and one model-like kind.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from ..config import SamplingParams
from ..core.batch import RowBuffers
from ..core.rates import PRIOR_ACCEPTANCE, DecayedRates
from ..models.rows import RowIds
from ..models.timing import ForwardTimes
from ..sampling.draft_q import DraftQ
from ..sampling.draft_tree import DraftTree
from ..sampling.noise import StepNoise
from .draft_vocab import DraftVocab
from .protocol import DraftDraw, Drafter, Proposal, TreeDrafter
from .suffix import Lookup, SuffixDrafter

PRIOR_DRAFTS = 4  # the model's α_j starts at PRIOR_ACCEPTANCE, worth this many drafts
DECAY = 0.98  # per step (memory ~50 steps)
SUFFIX_BRANCHES = 2  # a tree's nodes per level that continue the suffix index's continuations (`propose_tree`)


class SuffixOrModelDrafter(Drafter):
    """`suffix` and `model` (any drafter that proposes γ drafts for the rows it is given, `live` a slice or
    an index tensor of slots) behind one `Drafter`; stats under "suffix" and the model's name."""

    def __init__(self, suffix: SuffixDrafter, model: Drafter, vocab_size: int):
        self.suffix, self.model = suffix, model
        self.trainable, self.wants_hidden = model.trainable, model.wants_hidden
        self.names = (*suffix.names, *model.names)
        self.vocab_size = vocab_size
        self.model_rates = DecayedRates()  # the model-served rows' drafts, per draft position
        self._model_rows: list[bool] = []  # which rows this step's proposal gave the model (until `keep`)
        self._source: torch.Tensor | None = None  # [n] the same on the device (1: the model's)

    @property
    def num_forwards(self) -> int:
        return self.model.num_forwards

    def model_expected(self, gamma: int) -> float:
        """Expected drafts kept of a model proposal of γ drafts: Σ_k Π_{j≤k} α_j."""
        return self._model_survival(gamma)[-1]

    def _model_survival(self, gamma: int) -> list[float]:
        """[γ+1]: a model proposal's drafts expected kept if w of them are verified, w = 0..γ."""
        out, survive = [0.0], 1.0
        for j in range(gamma):
            survive *= self.model_rates.rate(j, PRIOR_ACCEPTANCE, PRIOR_DRAFTS)
            out.append(out[-1] + survive)
        return out

    def choose(self, found: Lookup, gamma: int) -> list[bool]:
        """Per row: True where the model's proposal is expected to keep more drafts than the suffix's."""
        bar = self.model_expected(gamma)
        return [self.suffix.expected_accepted(m, len(d)) < bar for m, d in zip(found.match, found.drafts)]

    def propose(self, live: slice, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        n = live.stop
        self.model_rates.grow(gamma)
        found = self.suffix.lookup(n, gamma)
        use_model = self._model_rows = self.choose(found, gamma)
        if not any(use_model):  # no model forward at all; as wide as the longest suffix proposal
            return self.suffix.to_proposal(found, gamma)
        served = [b for b, m in enumerate(use_model) if m]
        # Drafts, lengths, sources and the model's rows travel to the device in one copy.
        host = [t for d, m in zip(found.drafts, use_model) for t in ([0] * gamma if m else d + [0] * (gamma - len(d)))]
        host += [gamma if m else len(d) for d, m in zip(found.drafts, use_model)] + [int(m) for m in use_model] + served
        packed = torch.tensor(host, dtype=torch.long, device=rows.tokens.device)  # [n·γ + 2n + k]
        drafts = packed[: n * gamma].view(n, gamma)  # [n, γ]
        lengths, source = packed[n * gamma : n * gamma + n], packed[n * gamma + n : n * gamma + 2 * n]  # [n] 1: model
        self._source = source
        if len(served) == n:
            part = self.model.propose(live, rows, gamma, params, draw)
            drafts, q = part.drafts, part.q
        else:  # the model's q for the rows it served, point masses for the suffix's
            idx = RowIds(packed[n * gamma + 2 * n :], served)  # [k]
            part = self.model.propose(idx, rows, gamma, params, functools.partial(draw, rows=idx.index))
            drafts[idx.index] = part.drafts
            q = part.q.select(idx.index, n)
        model = self._model_survival(gamma)
        suffix = self.suffix.expected_by_width(found, gamma, [not m for m in use_model])
        expected = [s + len(served) * m for s, m in zip(suffix, model)]
        return Proposal(drafts, q, lengths, source, expected)

    @property
    def tree_ready(self) -> bool:
        return isinstance(self.model, TreeDrafter) and self.model.tree_ready

    def propose_tree(self, live: slice, rows: RowBuffers, depth: int, width: int, params: SamplingParams,
                     noise: StepNoise) -> Proposal:
        """One tree of `width` nodes per level: the first `SUFFIX_BRANCHES` (at most width − 1) nodes of each level
        continue the suffix index's best continuations with distinct first tokens (chains under the root, point
        masses; padding past a continuation's end), the rest are the model's tree (module docstring)."""
        n, device = live.stop, rows.tokens.device
        branches = min(SUFFIX_BRANCHES, width - 1)
        found = self.suffix.lookup(n, depth)  # the best continuation, scored as the chain step's lookup is
        chains = [[d] + [t for t, _ in self.suffix.index.lookup_several(b, depth, branches) if t[:1] != d[:1]]
                  if d else [] for b, d in enumerate(found.drafts)]
        chains = [(c + [[]] * branches)[:branches] for c in chains]  # [n][s] token lists
        part = self.model.propose_tree(live, rows, depth, width - branches, params, noise)
        host = [t for row in chains for c in row for t in c + [0] * (depth - len(c))]
        host += [len(c) for row in chains for c in row]
        packed = torch.tensor(host, dtype=torch.long, device=device)  # [n·s·D + n·s]: one host→device copy
        cut = n * branches * depth
        suffix, lengths = packed[:cut].view(n, branches, depth), packed[cut:].view(n, branches)
        merged = depth * width
        col = torch.arange(merged, device=device)
        level, slot = col // width, col % width  # [M']
        is_suffix = slot < branches
        model_cols = (~is_suffix).nonzero()[:, 0]  # [M] where the model's nodes go, in its order
        remap = torch.cat([model_cols.new_zeros(1), model_cols + 1])  # model node id → merged node id
        parents = torch.where(level > 0, (level - 1) * width + slot + 1, 0)[None].repeat(n, 1)  # a suffix chain's
        parents[:, model_cols] = remap[part.tree.parents]
        drafts = torch.zeros_like(parents)
        drafts[:, is_suffix] = suffix.transpose(1, 2).reshape(n, -1)  # level-major, as the merged nodes
        drafts[:, model_cols] = part.drafts
        valid = torch.zeros_like(parents, dtype=torch.bool)
        valid[:, is_suffix] = (torch.arange(depth, device=device)[None, :, None] < lengths[:, None, :]).reshape(n, -1)
        valid[:, model_cols] = part.tree.valid
        fresh = is_suffix[None, :].expand(n, -1).clone()
        fresh[:, model_cols] = part.tree.fresh
        probs = part.q.probs.new_zeros(n, merged, part.q.probs.shape[-1])
        probs[:, model_cols] = part.q.probs
        q = DraftQ(probs, part.q.ids, is_suffix[None, :].expand(n, -1), self.vocab_size)
        source = (~is_suffix).long()[None, :].expand(n, -1)  # 0: "suffix", 1: the model (`names`)
        return Proposal(drafts, q, tree=DraftTree(parents, fresh, valid, width, depth, source))

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        step = self.suffix.fetch(rows)
        self.suffix.ingest(step)
        # A plain step (γ = 0) was proposed nothing: no row took the model (the list is this step's only).
        served, self._model_rows = self._model_rows or [False] * accepted_len.shape[0], []
        if any(served):
            self._count_model(step.accepted, step.drafted, served)
        model_rows = torch.zeros_like(accepted_len, dtype=torch.bool) if self._source is None else self._source.bool()
        self._source = None
        self.model.keep(live, rows, seq_len, torch.where(model_rows, accepted_len, 0),
                        torch.where(model_rows, drafted_len, 0))

    def prefill(self, slots: torch.Tensor, rows: RowBuffers, count: torch.Tensor) -> None:
        self.suffix.prefill(slots, rows, count)
        self.model.prefill(slots, rows, count)

    def move_row(self, src: int, dst: int) -> None:
        self.suffix.move_row(src, dst)
        self.model.move_row(src, dst)

    def release(self) -> None:
        self.suffix.release()
        self.model.release()

    def allocate(self) -> None:
        self.suffix.allocate()
        self.model.allocate()

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.model.load_weights(state_dict)

    def learnt_state(self) -> dict[str, Any]:
        """The suffix drafter's history ("suffix") and the model-served rows' running acceptance ("model_rates")."""
        return {**self.suffix.learnt_state(), "model_rates": self.model_rates.state_dict()}

    def load_learnt_state(self, state: dict[str, Any]) -> None:
        self.suffix.load_learnt_state(state)
        self.model_rates.load_state_dict(state["model_rates"])

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        self.model.set_draft_vocab(vocab)

    def draft_vocab(self) -> torch.Tensor | None:
        return self.model.draft_vocab()

    def cost_key(self) -> str:
        return f"{self.suffix.cost_key()}+{self.model.cost_key()}"

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        """The model's drafts plus the lookups: the step's cost when any row takes the model."""
        model = self.model.time_drafts(batch_sizes, deadline)
        lookups = self.suffix.time_drafts(batch_sizes, deadline)
        return ForwardTimes(model.batch_sizes, model.query_lens,
                            [[a + b for a, b in zip(m, s)] for m, s in zip(model.times, lookups.times)])

    def _count_model(self, accepted: list[int], drafted: list[int], served: list[bool]) -> None:
        """Fold in the model-served rows' outcomes: draft j was reached if drafts < j were kept."""
        self.model_rates.decay(DECAY)
        for kept, verified, model in zip(accepted, drafted, served):
            if model:
                for j in range(min(kept + 1, verified)):
                    self.model_rates.add(j, j < kept, 1)

