"""EagleDrafter: an EAGLE-style head that drafts autoregressively over the target's features.

The head (`heads.EagleHead`) reads pairs (h_t, x_{t+1}) — the target's hidden state at position t
(`hidden`) and the token it predicted there — and predicts h_{t+1}, whose LM-head logits are
the draft distribution for x_{t+2}. Its own one-layer ragged KV cache holds one entry per pair, at
slot and position t.

A row of S tokens has target states for t ≤ S - 2 (verification's, kept tokens only), so its real pairs
are t ∈ [0, S - 2]. The cache is kept at least one real pair behind, like `ModelDrafter`'s: each step
catches up the missing real pairs in one ragged forward, whose last output gives q for the first draft;
each further draft feeds the pair (predicted feature, previous draft). Those pairs (t ≥ S - 1) hold
predicted features, so `keep` rolls the cache back to S - 1 pairs (the old S), and the next step feeds
the real states verification computed for them. Rows it did not draft for (another drafter served them,
or plain steps) just fall further behind and catch up the same way.

Trees (`tree_width`): EAGLE-2's dynamic tree, level by level over the same cache (`propose_tree`).
Departs from EAGLE: EAGLE-1 drops the layer's input norm, this head keeps it; the head's output is final-normed
so that it lives where the target's features do.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import EngineConfig, SamplingParams
from ..core.batch import RowBuffers
from ..models.cache import LayerShape, RaggedKVCache
from ..models.memory import module_bytes
from ..models.rows import RowIds, Rows, device_index, pick
from ..models.runner import ModelRunner
from ..models.timing import CALIBRATION_CONTEXT, DRAFT_PARAMS, ForwardTimes, time_draft_calls
from ..models.weights import cast_module
from ..sampling.draft_tree import tree_ancestors
from ..sampling.logits import process_logits
from ..sampling.noise import StepNoise, gumbel_max
from .draft_vocab import VocabDraws
from .heads.eagle import EagleHead
from .own_cache_mixin import OwnCacheMixin
from .protocol import DraftDraw, DrafterMemory, Proposal
from .tree_draft import confidence, grow_tree


class EagleDrafter(OwnCacheMixin):
    weights_role = "eagle head"
    names = ("eagle",)
    trainable = True
    wants_hidden = True

    def __init__(self, head: EagleHead, embed: nn.Module, lm_head: nn.Module, slots: int, length: int,
                 dtype: torch.dtype, device: torch.device):
        self.head = cast_module(head, device, dtype).eval().requires_grad_(False)
        self.embed, self.lm_head = embed, lm_head  # the target's: never trained here
        shape = LayerShape(head.num_kv_heads, head.head_dim, head.head_dim)
        self.cache = RaggedKVCache([shape], slots, length, dtype, device)
        self.device = device
        self.max_input_id = embed.weight.shape[0] - 1
        self.draws = VocabDraws(lm_head.weight.shape[0])
        self.num_forwards = 0

    @torch.inference_mode()
    def propose(self, live: Rows, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        """`live` may be a slice or some of the live rows (`models.rows.RowIds`)."""
        index = device_index(live)
        n = rows.seq_len[index].shape[0]
        drafts = torch.empty(n, gamma, dtype=torch.long, device=self.device)  # [n, γ]
        q = torch.empty(n, gamma, self.draws.width, device=self.device)  # [n, γ, K]
        if gamma == 0:
            return Proposal(drafts, self.draws.proposal_q(q))
        feature = self.catch_up(live, rows)  # [n, H]
        for i in range(gamma):
            logits = self.draws.logits(self._draft_input(feature), self.lm_head)  # [n, K]
            q[:, i], drafts[:, i] = self.draws.draw(logits, params, draw, i)
            if i < gamma - 1:
                feature = self._feed(live, drafts[:, i : i + 1], feature[:, None], self.cache.lens[index],
                                     torch.ones(n, dtype=torch.long, device=self.device),
                                     pick(self.cache.host_lens, live), [1] * n)[:, 0]
        return Proposal(drafts, self.draws.proposal_q(q))

    tree_ready = True

    @torch.inference_mode()
    def propose_tree(self, live: Rows, rows: RowBuffers, depth: int, width: int, params: SamplingParams,
                     noise: StepNoise) -> Proposal:
        """EAGLE-2's dynamic tree (Li et al. 2024, arXiv 2406.16858) on this head, grown by `tree_draft.grow_tree`.
        A node is the pair (its parent's predicted feature, its token) fed through the head at the position a chain
        would feed it (depth − 1 past the row's S − 1 real pairs), seeing the row's pairs and its ancestors' (a tree
        mask over the slots its level is written to); its output's LM-head logits are its children's q. The
        levels are written past the cache's length, which never moves: `keep` leaves the real pairs and the next
        catch-up overwrites the tree's slots with the kept path's."""
        index = device_index(live)
        root = self.catch_up(live, rows)  # [n, H] the output whose logits draft depth 1
        n = root.shape[0]
        base, host_base = self.cache.lens[index], pick(self.cache.host_lens, live)  # [n] S − 1
        outputs = root.new_zeros(n, depth * width, root.shape[-1])  # [n, D·w, H] each drafted node's head output

        def expand(tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
            offset = (level - 1) * width
            mine = parents[:, offset:]  # [n, w] each node's parent (0: the root)
            features = torch.where((mine == 0)[..., None], root[:, None], outputs.gather(
                1, (mine - 1).clamp_min(0)[..., None].expand(-1, -1, root.shape[-1])))  # [n, w, H]
            self.cache.plan_write(live, base + offset, width, host_start=[b + offset for b in host_base])
            kv = torch.arange(self.cache.plan.kv_len, device=self.device)  # [K]
            seen = tree_ancestors(parents, width)[:, 1 + offset :, 1:]  # [n, w, d·w] ancestor-or-self, drafted
            drafted = kv[None, :] - base[:, None]  # [n, K] the drafted node a slot holds (< 0: the row's pairs)
            in_tree = (drafted >= 0) & (drafted < offset + width)
            sees = seen.gather(2, drafted.clamp(0, offset + width - 1)[:, None].expand(-1, width, -1))  # [n, w, K]
            mask = ((drafted < 0)[:, None] | (in_tree[:, None] & sees))[:, None]  # [n, 1, w, K]
            positions = (base + level - 1)[:, None].expand(-1, width)  # [n, w] where a chain would feed them
            out = self._planned(tokens, features, positions, mask, real=False)
            outputs[:, offset : offset + width] = out
            return confidence(self.draws.logits(self._draft_input(out), self.lm_head), params)  # [n, w, K]

        root_q = confidence(self.draws.logits(self._draft_input(root), self.lm_head), params)  # [n, K]
        ids = None if self.draws.vocab is None else self.draws.vocab.ids  # what q is over (an own head's ids too)
        grown = grow_tree(root_q, depth, width, expand, noise, ids, live.index if isinstance(live, RowIds) else None)
        return Proposal(grown.drafts, self.draws.proposal_q(grown.probs), tree=grown.tree)

    def catch_up(self, live: Rows, rows: RowBuffers) -> torch.Tensor:
        """Feed the real pairs the cache lacks (at least one: its output drafts); the last one's output [n, H], the
        feature whose LM-head logits are q of the row's first draft. The cache then holds S − 1 pairs."""
        index = device_index(live)
        seq_len = rows.seq_len[index]  # [n]
        n = seq_len.shape[0]
        start, host_start = self.cache.lens[index], pick(self.cache.host_lens, live)  # [n]
        count = (seq_len - 1 - start).clamp_min(1)  # [n] real pairs to catch up (≥ 1: its output drafts)
        host_count = [max(s - 1 - c, 1) for s, c in zip(pick(rows.host_seq_len, live), host_start)]
        t = start[:, None] + torch.arange(max(host_count), device=self.device)  # [n, Q] pair positions
        hidden = rows.hidden[index]  # [n, L, H]
        features = hidden.gather(1, t.clamp_max(hidden.shape[1] - 1)[..., None].expand(-1, -1, hidden.shape[-1]))
        tokens = rows.tokens[index].gather(1, (t + 1).clamp_max(rows.tokens.shape[1] - 1))  # [n, Q] x_{t+1}
        out = self._feed(live, tokens, features, start, count, host_start, host_count, real=True)  # [n, Q, H]
        return out[torch.arange(n, device=self.device), count - 1]

    def _feed(self, rows: Rows, tokens: torch.Tensor, features: torch.Tensor, start: torch.Tensor,
              count: torch.Tensor, host_start: list[int], host_count: list[int], real: bool = False) -> torch.Tensor:
        """Pairs (features [n, Q, ·], tokens [n, Q]) at positions start + q; `count` [n] of them are real
        (the rest padding; `host_start`, `host_count`: the same on the host); `real`: the features are the
        target's (`RowBuffers.hidden`), else the head's own. Returns the head's outputs [n, Q, H] and advances
        the cache by `count`."""
        positions = self.cache.plan_write(rows, start, tokens.shape[1], host_start=host_start)  # [n, Q]
        slots = torch.arange(self.cache.plan.kv_len, device=self.device)
        mask = (slots[None, None, :] <= positions[:, :, None])[:, None]  # [n, 1, Q, K]
        out = self._planned(tokens, features, positions, mask, real)
        self.cache.set_lens(rows, start + count, [s + c for s, c in zip(host_start, host_count)])
        return out

    def _planned(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                 real: bool) -> torch.Tensor:
        """The head's forward over the write the cache has planned (`plan_write`), which it then clears."""
        try:
            embeds = self.embed(tokens.clamp_max(self.max_input_id))
            return self._run_head(embeds, features.to(self.head.fc.weight.dtype), positions, mask, real)
        finally:
            self.cache.plan = None
            self.num_forwards += 1

    def _run_head(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                  real: bool) -> torch.Tensor:
        """The head over its ragged cache: predicted features (final-normed) from either kind of input."""
        return self.head(embeds, features, positions, self.cache.layers[0].update, mask)

    def _draft_input(self, out: torch.Tensor) -> torch.Tensor:
        """What the LM head reads of a head output [n, H]: the output itself (EAGLE-1's is final-normed)."""
        return out

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """Drop the pairs that used predicted features: those at positions ≥ the old length - 1."""
        host = [min(c, max(s - 1, 0)) for c, s in zip(self.cache.host_lens[live], rows.last_step.seq_len)]
        self.cache.set_lens(live, torch.minimum(self.cache.lens[live], (seq_len - 1).clamp_min(0)), host)

    def cost_key(self) -> str:
        head = self.head
        return (f"eagle:{head.fc.weight.shape}:{head.gate_proj.weight.shape}:{head.num_heads}/{head.num_kv_heads}:"
                f"{head.fc.weight.dtype}:{self.lm_head.weight.shape}:draft_vocab{self.draws.width}")

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        """Timed on its own cache at engine start (nothing live); its lengths are reset after."""
        width = self.head.fc.weight.shape[0]

        @torch.inference_mode()
        def draft(batch: int, query_len: int) -> None:
            rows = slice(0, batch)
            tokens = torch.zeros(batch, query_len, dtype=torch.long, device=self.device)
            features = torch.zeros(batch, query_len, width, dtype=self.head.fc.weight.dtype, device=self.device)
            at = min(CALIBRATION_CONTEXT, self.cache.length - 3)
            start = torch.full((batch,), at, dtype=torch.long, device=self.device)
            out = self._feed(rows, tokens, features, start, torch.zeros_like(start), [at] * batch, [0] * batch)
            probs = process_logits(self.draws.logits(self._draft_input(out[:, -1]), self.lm_head), DRAFT_PARAMS)
            gumbel_max(probs, torch.zeros_like(probs))

        try:
            return time_draft_calls(draft, batch_sizes, deadline, self.device)
        finally:
            self.cache.set_lens(slice(None), torch.zeros_like(self.cache.lens), [0] * len(self.cache.host_lens))
            self.num_forwards = 0


def fresh_head(config: EngineConfig, target_config) -> EagleHead:
    """A fresh EAGLE head for the target: one of its layers, its MLP `config.eagle_intermediate_size` wide (None: the
    target's)."""
    return EagleHead.for_target(target_config, intermediate_size=config.eagle_intermediate_size)


def build(head: EagleHead | None, config: EngineConfig, target: ModelRunner) -> EagleDrafter:
    """The "eagle" kind (`registry`): `head` (None: a fresh one) on the target's hidden states."""
    model = target.model
    head = head if head is not None else fresh_head(config, model.config)
    return EagleDrafter(head, model.get_input_embeddings(), model.get_output_embeddings(), config.max_batch_size,
                        config.cache_len, config.dtype, target.device)


def memory(head: object, config: EngineConfig, target) -> DrafterMemory:
    """Its one-layer cache, its weights and the target's last hidden state per position."""
    head = head if isinstance(head, EagleHead) else EagleHead.for_target(target.config)
    return DrafterMemory([LayerShape(head.num_kv_heads, head.head_dim, head.head_dim)],
                         module_bytes(head, config.dtype), target.config.get_text_config().hidden_size)
