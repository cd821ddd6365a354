"""RecurrentDrafter: the ReDrafter head (`heads.recurrent.RecurrentHead`) drafting chains and beam-search trees.

Per step and live row of S tokens: h is the target's newest hidden state (position S − 2, written by the last
verification: `hidden.last_hidden`), and the row's last token x_{S−1} (the one h predicted) is fed first, s_1 =
cell(h, embed(x_{S−1})): its readout's LM-head logits are q of the first draft. Each further draft feeds the one
before. The head keeps no cache and no per-row state: a step's recurrence starts again from the newest h, so `keep`
has nothing to roll back, and rows another drafter served (or plain steps) need no catching up.

Trees (`tree_width` w ≥ 2, fixed or chosen per step by the cost model): ReDrafter's beam search, grown by
`tree_draft.grow_tree` — each level keeps the w (parent, child) pairs of highest path confidence (the product of q
along the path: a beam's probability), every kept node carrying its own recurrent state, so the beams that share a
prefix share its nodes and the engine verifies them as one token tree in one target forward. Where it departs from
ReDrafter, and why: ReDrafter takes each beam's top tokens by q, deterministic; the lossless tree rule needs each
node's children drawn from its q without replacement, so the children are a Gumbel-top-k draw with the noise of
their depth (`StepNoise.draw_top`), the first of them the chain's draft — under greedy decoding the top tokens by q,
ReDrafter's own choice. And ReDrafter verifies its final w beams; here every node a level kept is a candidate (the
final beams' prefixes are among them, and a beam that fell out still gets its chance). q of every node is exactly
what its children were drawn from, so verification keeps the output the target's under both samplers.

The LM head is the target's (over `engine.draft_vocab` if set) or the head's own over its `draft_ids`
(`engine.recurrent_own_head`; a set draft vocabulary then keeps the ids both share).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..config import EngineConfig, SamplingParams
from ..core.batch import RowBuffers
from ..models.memory import module_bytes
from ..models.rows import RowIds, Rows, device_index
from ..models.runner import ModelRunner
from ..models.timing import DRAFT_PARAMS, ForwardTimes, time_draft_calls
from ..models.weights import cast_module, copy_into
from ..sampling.logits import process_logits
from ..sampling.noise import StepNoise, gumbel_max
from .draft_vocab import DraftVocab, VocabDraws, initial_ids
from .heads.recurrent import RecurrentHead
from .hidden import last_hidden
from .protocol import DraftDraw, Drafter, DrafterMemory, Proposal
from .tree_draft import confidence, grow_tree


class RecurrentDrafter(Drafter):
    names = ("recurrent",)
    trainable = True
    wants_hidden = True
    tree_ready = True

    def __init__(self, head: RecurrentHead, embed: nn.Module, lm_head: nn.Module, dtype: torch.dtype,
                 device: torch.device):
        """`embed`, `lm_head`: the target's (never trained here; its LM head drafts unless `head` has its own)."""
        if head.hidden_size != embed.weight.shape[1]:
            raise ValueError(f"recurrent head hidden_size={head.hidden_size} does not match the target's "
                             f"hidden_size={embed.weight.shape[1]}")
        vocab_size = lm_head.weight.shape[0]
        if head.draft_ids is not None and int(head.draft_ids[-1]) >= vocab_size:
            raise ValueError(f"recurrent draft_ids reach target id {int(head.draft_ids[-1])}: the target's "
                             f"vocabulary has {vocab_size} ids")
        self.head = cast_module(head, device, dtype).eval().requires_grad_(False)
        self.embed = embed
        self.lm_head = lm_head if head.lm_head is None else self.head.lm_head
        self.device = device
        self.max_input_id = embed.weight.shape[0] - 1
        self.draws = VocabDraws(vocab_size, self.head.draft_ids)
        self.num_forwards = 0

    def _start(self, live: Rows, rows: RowBuffers) -> tuple[torch.Tensor, torch.Tensor]:
        """(h [n, H], s_1 [n, H]) of each live row: its newest hidden state and the state after its last token."""
        index = device_index(live)
        hidden = last_hidden(rows, live).to(self.head.rnn_u.weight.dtype)  # [n, H]
        last = rows.tokens[index].gather(1, rows.seq_len[index, None] - 1)[:, 0]  # [n] x_{S−1}
        return hidden, self.head.cell(hidden, self._embed(last))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids.clamp_max(self.max_input_id)).to(self.head.rnn_u.weight.dtype)

    def _logits(self, hidden: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """fp32 logits [..., K] of the next token from the context h and a state."""
        self.num_forwards += 1
        return self.draws.logits(self.head.readout(hidden, state), self.lm_head)

    @torch.inference_mode()
    def propose(self, live: Rows, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        """`live` may be a slice or some of the live rows (`models.rows.RowIds`)."""
        n = rows.seq_len[device_index(live)].shape[0]
        drafts = torch.empty(n, gamma, dtype=torch.long, device=self.device)  # [n, γ]
        q = torch.empty(n, gamma, self.draws.width, device=self.device)  # [n, γ, K]
        if gamma == 0:
            return Proposal(drafts, self.draws.proposal_q(q))
        hidden, state = self._start(live, rows)
        for i in range(gamma):
            q[:, i], drafts[:, i] = self.draws.draw(self._logits(hidden, state), params, draw, i)
            if i < gamma - 1:
                state = self.head.cell(state, self._embed(drafts[:, i]))
        return Proposal(drafts, self.draws.proposal_q(q))

    @torch.inference_mode()
    def propose_tree(self, live: Rows, rows: RowBuffers, depth: int, width: int, params: SamplingParams,
                     noise: StepNoise) -> Proposal:
        """The beam search of the module docstring: a node's state is cell(its parent's state, its token), its
        children's q the readout of that state."""
        hidden, root = self._start(live, rows)  # [n, H] each
        n, size = root.shape
        states = root.new_zeros(n, depth * width, size)  # [n, D·w, H] each drafted node's state

        def expand(tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
            offset = (level - 1) * width
            mine = parents[:, offset:]  # [n, w] each node's parent (0: the root)
            above = torch.where((mine == 0)[..., None], root[:, None], states.gather(
                1, (mine - 1).clamp_min(0)[..., None].expand(-1, -1, size)))  # [n, w, H]
            level_states = self.head.cell(above, self._embed(tokens))  # [n, w, H]
            states[:, offset : offset + width] = level_states
            return confidence(self._logits(hidden[:, None].expand(-1, width, -1), level_states), params)  # [n, w, K]

        root_q = confidence(self._logits(hidden, root), params)  # [n, K]
        ids = None if self.draws.vocab is None else self.draws.vocab.ids  # what q is over (an own head's ids too)
        grown = grow_tree(root_q, depth, width, expand, noise, ids, live.index if isinstance(live, RowIds) else None)
        return Proposal(grown.drafts, self.draws.proposal_q(grown.probs), tree=grown.tree)

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """Nothing to roll back: the next step starts again from the hidden state verification kept."""

    def prefill(self, slots: torch.Tensor, rows: RowBuffers, count: torch.Tensor) -> None:
        """The target's prefill writes the prompt's hidden states."""

    def move_row(self, src: int, dst: int) -> None:
        """`RowBuffers.move_row` moves the hidden states."""

    def release(self) -> None:
        """No cache of its own: it reads `RowBuffers.hidden`, which the engine releases."""

    def allocate(self) -> None:
        """Nothing was released."""

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        copy_into(self.head, state_dict, "recurrent head")

    def draft_vocab(self) -> torch.Tensor | None:
        return self.draws.ids

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        self.draws.set(vocab, self.device)

    def cost_key(self) -> str:
        head = self.head
        return (f"recurrent:{head.hidden_size}x{len(head.blocks)}:{head.rnn_u.weight.dtype}:{self.lm_head.weight.shape}"
                f":draft_vocab{self.draws.width}")

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        """Every draft, the first included, is one cell, one readout and one LM head: both columns time that."""
        width = self.head.hidden_size
        dtype = self.head.rnn_u.weight.dtype

        @torch.inference_mode()
        def draft(batch: int, query_len: int) -> None:
            hidden = torch.zeros(batch, width, dtype=dtype, device=self.device)
            state = self.head.cell(hidden, self._embed(torch.zeros(batch, dtype=torch.long, device=self.device)))
            probs = process_logits(self._logits(hidden, state), DRAFT_PARAMS)
            gumbel_max(probs, torch.zeros_like(probs))

        try:
            return time_draft_calls(draft, batch_sizes, deadline, self.device)
        finally:
            self.num_forwards = 0


def fresh_head(config: EngineConfig, target_config) -> RecurrentHead:
    """A fresh recurrent head for the target: `config.recurrent_mlp_layers` residual blocks, trained at
    `config.recurrent_depths` draft depths; with `config.recurrent_own_head` an LM head of its own over the first
    draft vocabulary (`draft_vocab.initial_ids` of `config.draft_vocab` ids)."""
    draft_ids = None
    if config.recurrent_own_head:
        draft_ids = initial_ids(config.draft_vocab, target_config.get_text_config().vocab_size, target_config)
    return RecurrentHead.for_target(target_config, config.recurrent_mlp_layers, config.recurrent_depths, draft_ids)


def build(head: RecurrentHead | None, config: EngineConfig, target: ModelRunner) -> RecurrentDrafter:
    """The "recurrent" kind (`registry`): `head` (None: a fresh one) on the target's newest hidden state."""
    model = target.model
    head = head if head is not None else fresh_head(config, model.config)
    return RecurrentDrafter(head, model.get_input_embeddings(), model.get_output_embeddings(), config.dtype,
                            target.device)


def memory(head: object, config: EngineConfig, target) -> DrafterMemory:
    """No cache; its weights; the target's last hidden state per position."""
    head = head if isinstance(head, RecurrentHead) else fresh_head(config, target.config)
    return DrafterMemory(None, module_bytes(head, config.dtype), target.config.get_text_config().hidden_size)
