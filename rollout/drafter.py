"""The `Drafter` protocol and its default: an independent small causal LM with its own ragged cache.

A drafter proposes γ tokens for every live row together with the distribution q each was drawn from
(verification needs q), is told how many of them the target kept, and follows the scheduler's row
moves and prefills. Other drafters (a feature drafter on target hidden states, a suffix drafter over
sibling rollouts, layer-skip self-speculation) implement the same methods.

A drafter owns no randomness: it draws each draft with the `draw(q_i, i)` the engine hands it —
Gumbel-max with the token noise of that row and position (`sampling.StepNoise.draw_draft`), the noise
the target's own draw there uses. That shared noise is what makes the invariant sampler's output
independent of the drafter.

`ModelDrafter` keeps its cache one or two tokens behind the row (the last draft is never fed, and
after a rejection the kept prefix is shorter than what it fed); more after plain (γ = 0) steps, when
it is not run at all. Before drafting it catches up with one ragged forward, whose last logits give
q for the first draft.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from .batch import RowBuffers
from .config import SamplingParams
from .runner import ModelRunner
from .sampling import process_logits
from .weights import copy_into

# draw(q_i [n, V], i) → draft i [n], with the token noise of each row's position of draft i.
DraftDraw = Callable[[torch.Tensor, int], torch.Tensor]


@dataclass
class Proposal:
    drafts: torch.Tensor  # [n, γ] int64
    # [n, γ, V] drafter's processed probabilities the drafts were drawn from; NaN where its logits
    # were non-finite (`process_logits`): the engine then drops that row's drafts for the step.
    q: torch.Tensor


class Drafter(Protocol):
    num_forwards: int

    def propose(self, live: slice, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal: ...

    def keep(self, live: slice, seq_len: torch.Tensor, accepted_len: torch.Tensor, gamma: int) -> None: ...

    def prefill(self, slots: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor) -> None: ...

    def move_row(self, src: int, dst: int) -> None: ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None: ...


class ModelDrafter:
    """An independent small LM sharing the target's vocabulary (checked by the engine)."""

    def __init__(self, model: PreTrainedModel, slots: int, length: int, dtype: torch.dtype, device: torch.device,
                 target_vocab_size: int, lean: bool = True):
        self.runner = ModelRunner(model, slots, length, dtype, device, lean)
        self.target_vocab_size = target_vocab_size

    @property
    def num_forwards(self) -> int:
        return self.runner.num_forwards

    def propose(self, live: slice, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        n, device = live.stop, self.runner.device
        drafts = torch.empty(n, gamma, dtype=torch.long, device=device)  # [n, γ]
        q = torch.empty(n, gamma, self.target_vocab_size, device=device)  # [n, γ, V]
        if gamma == 0:
            return Proposal(drafts, q)
        lag = rows.seq_len[live] - self.runner.cache.lens[live]  # [n] ≥ 1
        logits = self.runner.extend(live, rows.tokens[live], lag)  # [n, V_d]
        for i in range(gamma):
            q[:, i] = process_logits(self._to_target_vocab(logits), params)
            drafts[:, i] = draw(q[:, i], i)
            if i < gamma - 1:
                logits = self.runner.feed(live, drafts[:, i : i + 1])[:, 0]
        return Proposal(drafts, q)

    def keep(self, live: slice, seq_len: torch.Tensor, accepted_len: torch.Tensor, gamma: int) -> None:
        """Roll back to the kept prefix: the row's old tokens plus the accepted drafts it has fed."""
        if gamma:
            kept = seq_len + accepted_len.clamp_max(gamma - 1)
            self.runner.cache.lens[live] = torch.minimum(self.runner.cache.lens[live], kept)

    def prefill(self, slots: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor) -> None:
        self.runner.cache.reset_rows(slots)
        if int(count.max()) > 0:
            self.runner.extend(slots, tokens, count)

    def move_row(self, src: int, dst: int) -> None:
        self.runner.cache.move_row(src, dst)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        copy_into(self.runner.model, state_dict, "drafter")

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Drafter logits over the target's ids: extra drafter rows dropped, missing ones at -inf."""
        extra = self.target_vocab_size - logits.shape[-1]
        if extra < 0:
            return logits[..., : self.target_vocab_size]
        if extra > 0:
            return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))
        return logits
