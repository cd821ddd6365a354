"""ModelDrafter: the default drafter, an independent small causal LM with its own ragged cache.

It keeps its cache one or two tokens behind the row (the last draft is never fed, and after a rejection
the kept prefix is shorter than what it fed); more after steps it did not run in (plain steps, or rows
another drafter served). Before drafting it catches up with one ragged forward, whose last logits give q
for the first draft, then feeds each draft to get the next q. A tree (`propose_tree`, `tree_draft.grow_tree`)
feeds each level's nodes in one forward with a tree mask, past the row's cached tokens, and moves no length:
after the step the cache is back at the row's old length, and the next catch-up feeds the kept tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import PreTrainedModel

from ..config import EngineConfig, SamplingParams
from ..core.batch import RowBuffers
from ..models.cache import STATE_HISTORY, probe_layer_shapes
from ..models.memory import module_bytes
from ..models.rows import RowIds, Rows, device_index, pick
from ..models.runner import ModelRunner
from ..models.timing import DRAFT_PARAMS, ForwardTimes, draft_noise, model_cost_key, time_forwards
from ..models.tree_mask import TreeAttention
from ..models.weights import copy_into
from ..sampling.draft_tree import tree_ancestors
from ..sampling.logits import process_logits
from ..sampling.noise import StepNoise, gumbel_max
from .draft_vocab import DraftVocab, VocabDraws
from .protocol import DraftDraw, Drafter, DrafterMemory, Proposal
from .tree_draft import grow_tree


class ModelDrafter(Drafter):
    """An independent small LM sharing the target's vocabulary (checked by the engine)."""

    names = ("model",)
    trainable = True
    wants_hidden = False

    def __init__(self, model: PreTrainedModel, slots: int, length: int, dtype: torch.dtype, device: torch.device,
                 target_vocab_size: int, lean: bool = True, state_history: int = STATE_HISTORY,
                 max_tokens_per_forward: int | None = None):
        self.runner = ModelRunner(model, slots, length, dtype, device, lean, state_history,
                                  max_tokens_per_forward=max_tokens_per_forward)
        self.target_vocab_size = target_vocab_size
        self.draws = VocabDraws(target_vocab_size)

    @property
    def num_forwards(self) -> int:
        return self.runner.num_forwards

    def propose(self, live: Rows, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        """`live` may also be some of the live rows (`models.rows.RowIds`)."""
        index, device = device_index(live), self.runner.device
        n = rows.seq_len[index].shape[0]
        drafts = torch.empty(n, gamma, dtype=torch.long, device=device)  # [n, γ]
        q = torch.empty(n, gamma, self.draws.width, device=device)  # [n, γ, K]
        if gamma == 0:
            return Proposal(drafts, self.draws.proposal_q(q))
        head = self.draws.head(self.runner.model.get_output_embeddings())
        lag = rows.seq_len[index] - self.runner.cache.lens[index]  # [n] ≥ 1
        host_lag = [s - c for s, c in zip(pick(rows.host_seq_len, live), self.runner.host_lens(live))]
        logits = self.runner.extend(live, rows.tokens[index], lag, head=head, host_count=host_lag)  # [n, V_d] or [n, N]
        return self._draft(live, logits, drafts, q, params, draw, head)

    def draft_on(self, live: Rows, last: torch.Tensor, count: int, params: SamplingParams,
                 draw: DraftDraw) -> Proposal:
        """`count` drafts per row after feeding it `last` [n, 1], the draft `propose` drew but did not feed: the
        drafts of the next step if every draft of this one is kept (`placement.ahead`: drafting beside verification,
        `draw` hands out the noise of the positions after this step's)."""
        head = self.draws.head(self.runner.model.get_output_embeddings())
        n = last.shape[0]
        drafts = torch.empty(n, count, dtype=torch.long, device=self.runner.device)  # [n, count]
        q = torch.empty(n, count, self.draws.width, device=self.runner.device)  # [n, count, K]
        logits = self.runner.feed(live, last, head=head)[:, 0]  # [n, K]
        return self._draft(live, logits, drafts, q, params, draw, head)

    def _draft(self, live: Rows, logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor, params: SamplingParams,
               draw: DraftDraw, head) -> Proposal:
        """Fill `drafts` [n, γ] and `q` [n, γ, K] from the first draft's logits, feeding each draft but the last."""
        gamma = drafts.shape[1]
        for i in range(gamma):
            q[:, i], drafts[:, i] = self.draws.draw(self._to_target_vocab(logits.float()), params, draw, i)
            if i < gamma - 1:
                logits = self.runner.feed(live, drafts[:, i : i + 1], head=head)[:, 0]
        return Proposal(drafts, self.draws.proposal_q(q))

    @property
    def tree_ready(self) -> bool:
        """A recurrent drafter LM cannot score a tree in one forward (`models.tree_mask`)."""
        return not self.runner.cache.state_layers

    def propose_tree(self, live: Rows, rows: RowBuffers, depth: int, width: int, params: SamplingParams,
                     noise: StepNoise) -> Proposal:
        """`depth` levels of `width` nodes per row by the drafter's confidence (greedy: q at T = 1 ranks the
        children; the accept rule then only compares tokens). `live` may be some of the live rows (`RowIds`)."""
        index = device_index(live)
        head = self.draws.head(self.runner.model.get_output_embeddings())
        lag = rows.seq_len[index] - self.runner.cache.lens[index]  # [n] ≥ 1
        host_lag = [s - c for s, c in zip(pick(rows.host_seq_len, live), self.runner.host_lens(live))]
        logits = self.runner.extend(live, rows.tokens[index], lag, head=head, host_count=host_lag)  # [n, K]
        base, host_base = self.runner.cache.lens[index], self.runner.host_lens(live)  # [n]: the row's length

        def confidence(logits: torch.Tensor) -> torch.Tensor:
            logits = self._to_target_vocab(logits.float())
            return logits.softmax(-1) if params.greedy else process_logits(logits, params)

        def expand(tokens: torch.Tensor, parents: torch.Tensor, level: int) -> torch.Tensor:
            seen = tree_ancestors(parents, width)[:, 1:, 1:]  # [n, d·w, d·w] among the drafted nodes
            depths = torch.arange(parents.shape[1], device=tokens.device) // width  # [d·w] depth − 1
            offset = (level - 1) * width
            tree = TreeAttention(base, seen[:, offset:], (base + level - 1)[:, None].expand(-1, width),
                                 base[:, None] + depths)
            out = self.runner.forward(live, tokens, base + offset, head=head, tree=tree,
                                      host_start=[b + offset for b in host_base])  # [n, w, K]
            return confidence(out)

        rows_of = live.index if isinstance(live, RowIds) else None
        grown = grow_tree(confidence(logits), depth, width, expand, noise, self.draws.ids, rows_of)
        q = self.draws.proposal_q(grown.probs)
        return Proposal(grown.drafts, q, tree=grown.tree)

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """Roll back to the kept prefix: the row's old tokens plus the accepted drafts it has fed (the
        cache never holds the last draft, so `min` also covers a full acceptance and rows not drafted).
        The host mirror takes the step's unmasked accepted lengths (`rows.last_step`): for a row this
        drafter did not draft for, the cache is behind the old length, so the `min` is its length either way."""
        step = rows.last_step
        host = [min(c, s + a) for c, s, a in zip(self.runner.host_lens(live), step.seq_len, step.accepted_len)]
        self.runner.rollback(live, torch.minimum(self.runner.cache.lens[live], seq_len + accepted_len), host)

    def prefill(self, slots: Rows, rows: RowBuffers, count: torch.Tensor) -> None:
        """One device→host copy of `count` per admission (the protocol passes it as a tensor)."""
        self.runner.cache.reset_rows(slots)
        host_count = count.tolist()
        if max(host_count) > 0:
            self.runner.extend(slots, rows.tokens[device_index(slots)], count, host_count=host_count)

    def move_row(self, src: int, dst: int) -> None:
        self.runner.cache.move_row(src, dst)

    def release(self) -> None:
        self.runner.cache.release()

    def allocate(self) -> None:
        self.runner.cache.allocate()

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        copy_into(self.runner.model, state_dict, "drafter")

    def draft_vocab(self) -> torch.Tensor | None:
        return self.draws.ids

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        self.draws.set(vocab, self.runner.device, head_rows=self.runner.vocab_size)

    def cost_key(self) -> str:
        return model_cost_key(self.runner) + f":draft_vocab{self.draws.width}"

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        # A draft costs its forward plus turning the logits into a sampled token (T = 1, the dearer
        # mode): for small drafters, and on GPUs where small kernels are launch-bound, that is no
        # rounding error.
        def sample(logits: torch.Tensor) -> torch.Tensor:
            return gumbel_max(process_logits(logits[:, -1], DRAFT_PARAMS), draft_noise(logits))

        head = self.draws.head(self.runner.model.get_output_embeddings())
        return time_forwards(self.runner, batch_sizes, [1, 2], deadline, then=sample, head=head)

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Drafter logits over the target's ids: extra drafter rows dropped, missing ones at -inf (over a draft
        vocabulary they already are)."""
        if self.draws.vocab is not None:
            return logits
        extra = self.target_vocab_size - logits.shape[-1]
        if extra < 0:
            return logits[..., : self.target_vocab_size]
        if extra > 0:
            return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))
        return logits


def build(drafter: PreTrainedModel, config: EngineConfig, target: ModelRunner) -> ModelDrafter:
    """The "model" kind (`registry`): the drafter LM passed to `SpecEngine`, on its own ragged cache."""
    return ModelDrafter(drafter, config.max_batch_size, config.cache_len, config.dtype, target.device,
                        target.vocab_size, config.lean_forward, config.state_history, config.prefill_chunk_tokens)


def memory(drafter: object, config: EngineConfig, target: PreTrainedModel) -> DrafterMemory:
    """The drafter LM's cache and weights (nothing before one is given: `build` refuses that)."""
    if not isinstance(drafter, PreTrainedModel):
        return DrafterMemory()
    return DrafterMemory(probe_layer_shapes(drafter), module_bytes(drafter, config.dtype))
