"""LayerSkipDrafter: self-speculation with the target's first k layers, its final norm and LM head.

The drafter has no weights of its own (nothing for the online learner to train: `trainable` is False)
and follows the policy exactly as it trains — it *is* the policy, truncated. LayerSkip (Elhoushi et
al. 2024, arXiv 2404.16710) trains the model with layer dropout and an early-exit loss so that its
shallow exits predict well; a policy trained without that recipe exits poorly at shallow depth, so k
is a trade-off measured per model (`EngineConfig.layer_skip_layers`).

It shares the target's ragged cache for layers < k instead of keeping its own, and that is exact, not
an approximation: the K/V a layer l < k writes at slot s depends only on tokens ≤ s through layers ≤ l,
which are the same weights in draft and target. The target cache holds every token of a row but the
last, so the drafter feeds the last token at slot seq_len - 1 and its drafts after it — exactly the
tokens the verification forward feeds next, at the same slots, which it overwrites in every layer
before any query reads them (a query sees slots ≤ its own position). So draft writes are never read
by the target, rejected ones included, and no rollback or catch-up is needed: a row another drafter
served is as current as any. Where it departs from LayerSkip: the verification does not reuse the
draft's first-k-layer K/V and exit state (it recomputes them; the reuse would save k/L of its cost).

Lean forward only (Llama-family with sdpa: `models.lean`), which runs a prefix of the layers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from ..config import EngineConfig, SamplingParams
from ..core.batch import RowBuffers
from ..models.lean import unsupported_reason
from ..models.rows import Rows, device_index, pick
from ..models.runner import ModelRunner
from ..models.timing import (
    CALIBRATION_CONTEXT,
    DRAFT_PARAMS,
    ForwardTimes,
    draft_noise,
    model_cost_key,
    time_draft_calls,
)
from ..sampling.logits import process_logits
from ..sampling.noise import gumbel_max
from .draft_vocab import DraftVocab, VocabDraws
from .protocol import DraftDraw, Drafter, Proposal


class LayerSkipDrafter(Drafter):
    names = ("layer_skip",)
    trainable = False
    wants_hidden = False

    def __init__(self, target: ModelRunner, num_layers: int):
        total = len(target.model.model.layers) if target.lean is not None else None
        if target.lean is None:
            raise ValueError(f"drafters: 'layer_skip' needs the lean forward, which does not run this target "
                             f"({unsupported_reason(target.model) or 'lean_forward is off'})")
        if not 1 <= num_layers < total:
            raise ValueError(f"layer_skip_layers={num_layers} is invalid: an int in [1, {total - 1}] "
                             f"(the target has {total} layers)")
        self.target, self.num_layers = target, num_layers
        self.draws = VocabDraws(target.vocab_size)
        self.num_forwards = 0

    def propose(self, live: Rows, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        """`live` may be a slice or some of the live rows (`models.rows.RowIds`)."""
        index = device_index(live)
        start = rows.seq_len[index] - 1  # [n] = the target cache's length: it holds all but the last token
        host_start = [s - 1 for s in pick(rows.host_seq_len, live)]
        n, device = start.shape[0], start.device
        drafts = torch.empty(n, gamma, dtype=torch.long, device=device)  # [n, γ]
        q = torch.empty(n, gamma, self.draws.width, device=device)  # [n, γ, K]
        token = rows.tokens[index].gather(1, start[:, None])  # [n, 1] the row's last token
        for i in range(gamma):
            logits = self._forward(live, token, start + i, [s + i for s in host_start])[:, 0]  # [n, K]
            q[:, i], drafts[:, i] = self.draws.draw(logits.float(), params, draw, i)
            token = drafts[:, i : i + 1]
        return Proposal(drafts, self.draws.proposal_q(q))

    def _forward(self, rows: Rows, ids: torch.Tensor, start: torch.Tensor, host_start: list[int]) -> torch.Tensor:
        # The target runner counts forwards for the target's stats: a draft is not one.
        before = self.target.num_forwards
        try:
            head = self.draws.head(self.target.model.get_output_embeddings())
            return self.target.forward(rows, ids, start, num_layers=self.num_layers, head=head, host_start=host_start)
        finally:
            self.target.num_forwards = before
            self.num_forwards += 1

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """Nothing to roll back: its writes lie past the target's kept length (module docstring)."""

    def prefill(self, slots: torch.Tensor, rows: RowBuffers, count: torch.Tensor) -> None:
        """The target's prefill fills the shared layers."""

    def move_row(self, src: int, dst: int) -> None:
        """The target's cache moves the shared layers."""

    def release(self) -> None:
        """Its layers' K/V are the target's cache, which the engine releases."""

    def allocate(self) -> None:
        """Nothing was released."""

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        raise ValueError("the layer-skip drafter has no weights of its own: it follows the target's")

    def draft_vocab(self) -> torch.Tensor | None:
        return self.draws.ids

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        self.draws.set(vocab, self.target.device)

    def cost_key(self) -> str:
        return f"layer_skip{self.num_layers}:{model_cost_key(self.target)}:draft_vocab{self.draws.width}"

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        """Timed on the target's cache at engine start (no row is live then); its lengths are reset after."""
        cache, device = self.target.cache, self.target.device

        def draft(batch: int, query_len: int) -> None:
            rows = slice(0, batch)
            ids = torch.zeros(batch, query_len, dtype=torch.long, device=device)
            start = torch.full((batch,), CALIBRATION_CONTEXT, dtype=torch.long, device=device)
            logits = self._forward(rows, ids, start, [CALIBRATION_CONTEXT] * batch)
            gumbel_max(process_logits(logits[:, -1], DRAFT_PARAMS), draft_noise(logits))

        started = time.perf_counter()
        try:
            return time_draft_calls(draft, batch_sizes, max(deadline, started + 0.5), device)
        finally:
            cache.set_lens(slice(None), torch.zeros_like(cache.lens), [0] * len(cache.host_lens))
            self.num_forwards = 0


def build(drafter: None, config: EngineConfig, target: ModelRunner) -> LayerSkipDrafter:
    """The "layer_skip" kind (`registry`): the target's first `config.layer_skip_layers` layers (None: half)."""
    layers = config.layer_skip_layers or max(1, target.model.config.get_text_config().num_hidden_layers // 2)
    return LayerSkipDrafter(target, layers)
