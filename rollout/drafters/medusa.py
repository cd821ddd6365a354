"""MedusaDrafter: γ drafts in one shot from K heads on the target's newest hidden state.

Each step reads the row's newest valid hidden state h (position seq_len - 2, written by the last
verification: `hidden`), runs the K heads (`heads.MedusaHeads`) and the target's LM head once,
and draft i is drawn from head i's processed distribution q_i. Tree-free: one candidate per position.
Head i does not see drafts < i, so q_i is a distribution given the row's kept prefix only — a valid
proposal for the lossless rule (any q that depends on the prefix is), just a worse one the further
it reaches. Drafts past the K-th reuse head K's distribution. No cache, nothing to roll back: a
row's state is its newest hidden state, which verification keeps current. Trees (`tree_width`): Medusa's, each
depth's children from its head (`propose_tree`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..config import EngineConfig, SamplingParams
from ..core.batch import RowBuffers
from ..models.memory import module_bytes
from ..models.rows import RowIds, Rows
from ..models.runner import ModelRunner
from ..models.timing import DRAFT_PARAMS, ForwardTimes, time_draft_calls
from ..models.weights import copy_into
from ..sampling.logits import process_logits
from ..sampling.noise import StepNoise, gumbel_max
from .draft_vocab import DraftVocab, VocabDraws
from .heads.medusa import MedusaHeads
from .hidden import last_hidden
from .protocol import DraftDraw, Drafter, DrafterMemory, Proposal
from .tree_draft import confidence, grow_tree


class MedusaDrafter(Drafter):
    names = ("medusa",)
    trainable = True
    wants_hidden = True

    def __init__(self, heads: MedusaHeads, lm_head: nn.Module, dtype: torch.dtype, device: torch.device):
        self.heads = heads.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.lm_head = lm_head  # the target's: follows the policy's weights, never trained here
        self.device = device
        self.draws = VocabDraws(lm_head.weight.shape[0])
        self.num_forwards = 0

    @torch.inference_mode()
    def propose(self, live: Rows, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        """`live` may be a slice or some of the live rows (`models.rows.RowIds`)."""
        logits = self.draws.logits(self.heads(last_hidden(rows, live)), self.lm_head)  # [n, heads, V or N]
        self.num_forwards += 1
        columns = torch.arange(gamma, device=logits.device).clamp_max(self.heads.num_heads - 1)
        q = process_logits(logits[:, columns], params)  # [n, γ, K]
        extra = () if self.draws.vocab is None else (self.draws.vocab.ids,)
        drafts = torch.stack([draw(q[:, i], i, *extra) for i in range(gamma)], 1) if gamma else q.new_zeros(
            q.shape[0], 0, dtype=torch.long)  # [n, γ]
        return Proposal(drafts, self.draws.proposal_q(q))

    tree_ready = True

    @torch.inference_mode()
    def propose_tree(self, live: Rows, rows: RowBuffers, depth: int, width: int, params: SamplingParams,
                     noise: StepNoise) -> Proposal:
        """Medusa's tree (Cai et al. 2024, arXiv 2401.10774) without its fixed shape: head d reads only the row's
        newest hidden state, so every node at depth d has the same children's q, head d's (past the last head, the
        last head's); `tree_draft.grow_tree` picks the nodes by path confidence."""
        q = confidence(self.draws.logits(self.heads(last_hidden(rows, live)), self.lm_head), params)  # [n, heads, K]
        self.num_forwards += 1
        last = self.heads.num_heads - 1

        def expand(tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
            return q[:, min(level, last)][:, None].expand(-1, width, -1)  # [n, w, K]

        grown = grow_tree(q[:, 0], depth, width, expand, noise, self.draws.ids,
                          live.index if isinstance(live, RowIds) else None)
        return Proposal(grown.drafts, self.draws.proposal_q(grown.probs), tree=grown.tree)

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """Nothing to roll back: the next step reads the hidden state verification kept."""

    def prefill(self, slots: torch.Tensor, rows: RowBuffers, count: torch.Tensor) -> None:
        """The target's prefill writes the prompt's hidden states."""

    def move_row(self, src: int, dst: int) -> None:
        """`RowBuffers.move_row` moves the hidden states."""

    def release(self) -> None:
        """No cache of its own: it reads `RowBuffers.hidden`, which the engine releases."""

    def allocate(self) -> None:
        """Nothing was released."""

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        copy_into(self.heads, state_dict, "medusa heads")

    def draft_vocab(self) -> torch.Tensor | None:
        return self.draws.ids

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        self.draws.set(vocab, self.device)

    def cost_key(self) -> str:
        heads = self.heads
        return (f"medusa{heads.num_heads}x{heads.weight.shape[-1]}:{heads.weight.dtype}:{self.lm_head.weight.shape}"
                f":draft_vocab{self.draws.width}")

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        """One call drafts all γ: its time is the catch-up column, a further draft costs ~one sample."""
        width = self.heads.weight.shape[-1]

        @torch.inference_mode()
        def draft(batch: int, query_len: int) -> None:
            hidden = torch.zeros(batch, width, dtype=self.heads.weight.dtype, device=self.device)
            logits = self.draws.logits(self.heads(hidden), self.lm_head)  # [b, heads, V or N]
            for i in range(query_len):
                probs = process_logits(logits[:, min(i, logits.shape[1] - 1)], DRAFT_PARAMS)
                gumbel_max(probs, torch.zeros_like(probs))

        times = time_draft_calls(draft, batch_sizes, deadline, self.device)
        # Q = 1 is the whole call; each further draft adds one sample (the difference of the columns).
        return ForwardTimes(times.batch_sizes, [1, 2], [[max(two - one, 1e-7), one] for one, two in times.times])


def fresh_head(config: EngineConfig, target_config) -> MedusaHeads:
    """`config.medusa_heads` fresh heads (each predicts what the target predicts next) on the target's features."""
    return MedusaHeads(target_config.get_text_config().hidden_size, config.medusa_heads)


def build(heads: MedusaHeads | None, config: EngineConfig, target: ModelRunner) -> MedusaDrafter:
    """The "medusa" kind (`registry`): `heads` (None: fresh ones) through the target's LM head."""
    heads = heads if heads is not None else fresh_head(config, target.model.config)
    return MedusaDrafter(heads, target.model.get_output_embeddings(), config.dtype, target.device)


def memory(heads: object, config: EngineConfig, target) -> DrafterMemory:
    """No cache; the given heads' weights; the target's last hidden state per position."""
    weights = module_bytes(heads, config.dtype) if isinstance(heads, MedusaHeads) else 0
    return DrafterMemory(None, weights, target.config.get_text_config().hidden_size)
