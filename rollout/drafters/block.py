"""BlockDrafter: a DFlash-style block drafter (`heads.block.BlockHead`) — one forward drafts a whole block.

Per step and live row of S tokens: the anchor is the row's last kept token (position S − 1), the block is the
anchor and k − 1 mask positions, and its context is the target's captured states at positions 0 … S − 2
(verification's, kept tokens only: `hidden`; the target's runner captures the outputs of the head's
`target_layers`, `ModelRunner.capture_hidden`). The head's ragged cache holds each layer's context K/V, one
entry per position; a step first catches up the positions verification added since (a projection per layer,
no attention), then runs the block — its K/V written past the context, never kept: the cache's length stays at
S − 1, and the next step's catch-up writes the real context there. So `keep` has nothing to roll back.

Sampling: draft i (position S + i) is drawn from q_i, the block's processed *marginal* at that position (T,
top-k, top-p applied as for the target: `VocabDraws.draw`, through the engine's `draw` with the row and
position's noise), and q_i is exactly what verification divides by. The drafts of one block are drawn
independently from their marginals, not from a joint: draft i's q does not depend on the drafts before it. That
keeps the output the target's: the rejection rule is exact for any proposal q_i that is a function of the kept
prefix and the drafter's own randomness (draft i is only used when drafts < i were kept, and then p there is
the target's given exactly those tokens), and the invariant rule's output never depends on q at all. A joint
would be better-accepted, not more correct. Up to k − 1 drafts per step (a wider γ is narrowed), all at the
cost of one forward (`time_drafts` reports it so: auto-γ's `CostModel.draft_time`).
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
from ..sampling.logits import process_logits
from ..sampling.noise import StepNoise, gumbel_max
from .draft_vocab import VocabDraws
from .heads.block import BlockHead
from .own_cache_mixin import OwnCacheMixin
from .protocol import DraftDraw, DrafterMemory, Proposal
from .tree_draft import confidence, grow_tree


class BlockDrafter(OwnCacheMixin):
    weights_role = "block head"
    names = ("block",)
    trainable = True
    wants_hidden = True

    def __init__(self, head: BlockHead, embed: nn.Module, lm_head: nn.Module, slots: int, length: int,
                 dtype: torch.dtype, device: torch.device):
        """`embed`, `lm_head`: the target's (never trained here); `length`: the engine's cache length."""
        if head.hidden_size != embed.weight.shape[1]:
            raise ValueError(f"block head hidden_size={head.hidden_size} does not match the target's "
                             f"hidden_size={embed.weight.shape[1]}")
        self.head = cast_module(head, device, dtype).eval().requires_grad_(False)
        self.embed, self.lm_head = embed, lm_head
        shape = LayerShape(head.num_kv_heads, head.head_dim, head.head_dim)
        # The block is written past a row's end: k more slots than the engine's rows can hold.
        self.cache = RaggedKVCache([shape] * len(head.layers), slots, length + head.block_size, dtype, device)
        self.device = device
        self.max_input_id = embed.weight.shape[0] - 1
        self.draws = VocabDraws(lm_head.weight.shape[0])
        self.num_forwards = 0

    @torch.inference_mode()
    def propose(self, live: Rows, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        """`live` may be a slice or some of the live rows (`models.rows.RowIds`)."""
        index = device_index(live)
        seq_len = rows.seq_len[index]  # [n]
        width = min(gamma, self.head.block_size - 1)
        n = seq_len.shape[0]
        drafts = torch.empty(n, width, dtype=torch.long, device=self.device)  # [n, γ']
        q = torch.empty(n, width, self.draws.width, device=self.device)  # [n, γ', K]
        if width == 0:
            return Proposal(drafts, self.draws.proposal_q(q))
        out = self._anchored_block(live, rows)  # [n, k, H]
        logits = self.draws.logits(out[:, 1 : 1 + width], self.lm_head)  # [n, γ', K]
        for i in range(width):
            q[:, i], drafts[:, i] = self.draws.draw(logits[:, i], params, draw, i)
        return Proposal(drafts, self.draws.proposal_q(q))

    tree_ready = True

    @torch.inference_mode()
    def propose_tree(self, live: Rows, rows: RowBuffers, depth: int, width: int, params: SamplingParams,
                     noise: StepNoise) -> Proposal:
        """The block's marginals as a tree, as Medusa's heads give one: draft i's q does not depend on the drafts
        before it, so every node at depth d has the block's q_d as its children's q (past the block's k − 1
        drafts, the last one's); `tree_draft.grow_tree` picks the nodes by path confidence. One block forward
        for the whole tree."""
        out = self._anchored_block(live, rows)  # [n, k, H]
        drafts = min(depth, self.head.block_size - 1)
        q = confidence(self.draws.logits(out[:, 1 : 1 + drafts], self.lm_head), params)  # [n, d', K]

        def expand(tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
            return q[:, min(level, drafts - 1)][:, None].expand(-1, width, -1)  # [n, w, K]

        grown = grow_tree(q[:, 0], depth, width, expand, noise, self.draws.ids,
                          live.index if isinstance(live, RowIds) else None)
        return Proposal(grown.drafts, self.draws.proposal_q(grown.probs), tree=grown.tree)

    def _anchored_block(self, live: Rows, rows: RowBuffers) -> torch.Tensor:
        """Catch the context up to verification, then run the block anchored at each row's last kept token:
        its outputs [n, k, H]."""
        index = device_index(live)
        seq_len = rows.seq_len[index]  # [n]
        host_seq = pick(rows.host_seq_len, live)
        self._catch_up(live, rows.hidden[index], seq_len, host_seq)
        anchor = rows.tokens[index].gather(1, (seq_len - 1)[:, None])[:, 0]  # [n]
        return self._block(live, anchor, seq_len - 1, [s - 1 for s in host_seq])

    def _catch_up(self, rows: Rows, hidden: torch.Tensor, seq_len: torch.Tensor, host_seq: list[int]) -> None:
        """Write the context K/V of positions [cache length, S − 1) from the captured states `hidden` [n, L, m·H]."""
        start, host_start = self.cache.lens[device_index(rows)], pick(self.cache.host_lens, rows)  # [n]
        count = (seq_len - 1 - start).clamp_min(0)  # [n]
        host_count = [max(s - 1 - c, 0) for s, c in zip(host_seq, host_start)]
        width = max(host_count)
        if width == 0:
            return
        t = (start[:, None] + torch.arange(width, device=self.device)).clamp_max(hidden.shape[1] - 1)  # [n, C]
        features = hidden.gather(1, t[..., None].expand(-1, -1, hidden.shape[-1]))  # [n, C, m·H]
        positions = self.cache.plan_write(rows, start, width, count, host_start, host_count)  # [n, C]
        try:
            context = self.head.fuse(features.to(self.head.fc.weight.dtype))
            for layer, (k, v) in zip(self.cache.layers, self.head.context_kv(context, positions)):
                layer.update(k, v)
        finally:
            self.cache.plan = None
        self.cache.set_lens(rows, start + count, [s + c for s, c in zip(host_start, host_count)])

    def _block(self, rows: Rows, anchor: torch.Tensor, at: torch.Tensor, host_at: list[int]) -> torch.Tensor:
        """The block forward: anchor tokens [n] at positions `at` [n] (= the cache's lengths) and k − 1 masks,
        attending over the context and bidirectionally over the block → outputs [n, k, H]."""
        k = self.head.block_size
        positions = self.cache.plan_write(rows, at, k, host_start=host_at)  # [n, k]
        slots = torch.arange(self.cache.plan.kv_len, device=self.device)
        mask = (slots[None, :] < (at + k)[:, None])[:, None, None, :]  # [n, 1, 1, K]: context + the whole block
        layers = self.cache.layers
        try:
            x = self.head.block_inputs(self.embed(anchor.clamp_max(self.max_input_id)).to(self.head.fc.weight.dtype))
            return self.head(x, positions, lambda i, keys, values: layers[i].update(keys, values), mask)
        finally:
            self.cache.plan = None
            self.num_forwards += 1

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """Nothing to roll back: the cache holds real context only (the block's K/V lie past its lengths)."""

    def cost_key(self) -> str:
        head = self.head
        return (f"block{head.block_size}:{head.target_layers}:{len(head.layers)}x{head.fc.weight.shape}:"
                f"{head.layers[0].mlp.gate_proj.weight.shape}:{head.num_heads}/{head.num_kv_heads}:"
                f"{head.fc.weight.dtype}:{self.lm_head.weight.shape}:draft_vocab{self.draws.width}")

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        """One block forward (after a catch-up of two context positions) drafts every γ ≤ k − 1: the cost model's
        catch-up column (Q = 2) is that forward and one sample, its per-draft column (Q = 1) one more sample
        (`CostModel.draft_time` = block + (γ − 1) · sample). Timed on its own cache; lengths reset after."""
        width = self.head.fc.weight.shape[1]

        @torch.inference_mode()
        def draft(batch: int, samples: int) -> None:
            rows = slice(0, batch)
            at = min(CALIBRATION_CONTEXT, self.cache.length - self.head.block_size - 1)
            self.cache.set_lens(rows, torch.full((batch,), at - 2, device=self.device), [at - 2] * batch)
            hidden = torch.zeros(batch, at, width, dtype=self.head.fc.weight.dtype, device=self.device)
            seq_len = torch.full((batch,), at + 1, device=self.device)
            self._catch_up(rows, hidden, seq_len, [at + 1] * batch)
            out = self._block(rows, torch.zeros(batch, dtype=torch.long, device=self.device), seq_len - 1, [at] * batch)
            logits = self.draws.logits(out[:, 1 : 1 + samples], self.lm_head)  # [b, samples, K]
            for i in range(samples):
                probs = process_logits(logits[:, i], DRAFT_PARAMS)
                gumbel_max(probs, torch.zeros_like(probs))

        try:
            times = time_draft_calls(draft, batch_sizes, deadline, self.device)
        finally:
            self.cache.set_lens(slice(None), torch.zeros_like(self.cache.lens), [0] * len(self.cache.host_lens))
            self.num_forwards = 0
        # `time_draft_calls` timed `samples` = 1, 2 (its query lengths): Q = 2 is the block and one sample, each
        # further draft the difference.
        return ForwardTimes(times.batch_sizes, [1, 2], [[max(two - one, 1e-7), one] for one, two in times.times])


def fresh_head(config: EngineConfig, target_config) -> BlockHead:
    """A fresh block head for the target: `config.block_layers` (None: `heads.block.default_layers`), one draft
    layer, `config.block_size`."""
    return BlockHead.for_target(target_config, config.block_layers, config.block_size)


def check_fits(head: BlockHead, target_config, config: EngineConfig) -> None:
    """A `ValueError` naming the field where `head` cannot serve this target under `config`. Its block size is
    its own (a step drafts at most min(its k, `config.block_size`) - 1: `max_gamma` is capped by the config's)."""
    count = target_config.get_text_config().num_hidden_layers
    if head.target_layers[-1] > count - 2:
        raise ValueError(f"block layers {list(head.target_layers)} do not fit a target of {count} layers: "
                         f"ids in [0, {count - 2}] (the outputs verification captures are below the last layer)")
    if config.block_layers not in (None, head.target_layers):
        raise ValueError(f"engine.block_layers={config.block_layers} does not match the block head's target_layers="
                         f"{head.target_layers}: leave engine.block_layers unset (the head decides)")


def build(head: BlockHead | None, config: EngineConfig, target: ModelRunner) -> BlockDrafter:
    """The "block" kind (`registry`): `head` (None: a fresh one); verification captures its target layers."""
    model = target.model
    head = head if head is not None else fresh_head(config, model.config)
    check_fits(head, model.config, config)
    target.capture_hidden(head.capture_layers)
    return BlockDrafter(head, model.get_input_embeddings(), model.get_output_embeddings(), config.max_batch_size,
                        config.cache_len, config.dtype, target.device)


def memory(head: object, config: EngineConfig, target) -> DrafterMemory:
    """Its cache (one layer per draft layer, a block past each row), its weights and the fused target states."""
    head = head if isinstance(head, BlockHead) else fresh_head(config, target.config)
    shape = LayerShape(head.num_kv_heads, head.head_dim, head.head_dim)
    return DrafterMemory([shape] * len(head.layers), module_bytes(head, config.dtype),
                         target.config.get_text_config().hidden_size * len(head.target_layers))
