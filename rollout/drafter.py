"""The `Drafter` protocol and its default: an independent small causal LM with its own ragged cache.

A drafter proposes up to γ tokens for every live row together with the distribution q each was drawn
from (verification needs q), is told after the step which tokens the rows kept, and follows the
scheduler's row moves and prefills. It reports what its drafts cost (`time_drafts`, for auto-γ's cost
model) and whether it has weights the learner can update (`trainable`). The engine takes any object
with these methods: `ModelDrafter` (an independent LM, the default), `suffix.SuffixDrafter` (model-free,
over sibling and earlier completions), `multi_drafter.MultiDrafter` (a per-row choice between them), and
the drafters that read the target (`layer_skip.LayerSkipDrafter`, `eagle.EagleDrafter`,
`medusa.MedusaDrafter`; the last two ask for its hidden states: `wants_hidden`, `rollout.hidden`).

A drafter owns no randomness: it draws each draft with the `draw(q_i, i)` the engine hands it —
Gumbel-max with the token noise of that row and position (`sampling.StepNoise.draw_draft`), the noise
the target's own draw there uses. That shared noise is what makes the invariant sampler's output
independent of the drafter. A drafter whose q is a point mass (the suffix drafter) needs no draw.

`ModelDrafter` keeps its cache one or two tokens behind the row (the last draft is never fed, and
after a rejection the kept prefix is shorter than what it fed); more after steps it did not run in
(plain steps, or rows another drafter served). Before drafting it catches up with one ragged
forward, whose last logits give q for the first draft.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from .batch import RowBuffers
from .cache import STATE_HISTORY
from .config import SamplingParams
from .cost_model import DRAFT_PARAMS, ForwardTimes, draft_noise, model_cost_key, time_forwards
from .runner import ModelRunner
from .sampling import draw as gumbel_max
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
    # [n] drafts each row proposes (≤ γ; the rest are padding, never kept). None: all γ.
    lengths: torch.Tensor | None = None
    # [n] which of the drafter's `names` proposed each row (for per-drafter stats). None: all names[0].
    source: torch.Tensor | None = None
    # Host, [γ+1]: the drafts expected kept, all rows together, if only the first w columns are verified
    # (w = 0..γ). Given, an adaptive γ policy may verify fewer columns (`GammaPolicy.narrow`).
    expected_kept: list[float] | None = None


class Drafter(Protocol):
    names: tuple[str, ...]  # the kinds this drafter reports stats under (one, or one per sub-drafter)
    trainable: bool  # has weights `load_weights` can replace (the online learner's target)
    # reads the target's hidden states from verification (`RowBuffers.hidden`, kept only when asked)
    wants_hidden: bool
    num_forwards: int  # model forwards run so far

    def propose(self, live: slice, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        """Up to γ drafts for each of the live rows (rows.tokens[:, :seq_len] is each row's text). The
        proposal may be narrower than γ (no row's drafts past its width were worth verifying): the step
        then verifies that width."""
        ...

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """After a step: `rows` holds the kept tokens; `seq_len` [n] the lengths before the step,
        `drafted_len` [n] the drafts of this drafter's proposal that were verified and `accepted_len` [n]
        those kept (0 where it proposed none)."""
        ...

    def prefill(self, slots: torch.Tensor, rows: RowBuffers, count: torch.Tensor) -> None:
        """New requests in `slots` [k] (their prompts in `rows`); `count` [k] prompt tokens to feed now."""
        ...

    def move_row(self, src: int, dst: int) -> None: ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None: ...

    def cost_key(self) -> str:
        """What the drafts' cost depends on (model shape, layout, ...), for the calibration cache."""
        ...

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        """Seconds of one draft per batch size at query lengths [1, 2] (a draft after a catch-up of up
        to two tokens costs the second column, each further draft the first)."""
        ...


class ModelDrafter:
    """An independent small LM sharing the target's vocabulary (checked by the engine)."""

    names = ("model",)
    trainable = True
    wants_hidden = False

    def __init__(self, model: PreTrainedModel, slots: int, length: int, dtype: torch.dtype, device: torch.device,
                 target_vocab_size: int, lean: bool = True, state_history: int = STATE_HISTORY):
        self.runner = ModelRunner(model, slots, length, dtype, device, lean, state_history)
        self.target_vocab_size = target_vocab_size

    @property
    def num_forwards(self) -> int:
        return self.runner.num_forwards

    def propose(self, live: slice | torch.Tensor, rows: RowBuffers, gamma: int, params: SamplingParams,
                draw: DraftDraw) -> Proposal:
        """`live` may also be an index tensor of slots (a subset of the live rows)."""
        n, device = rows.seq_len[live].shape[0], self.runner.device
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

    def keep(self, live: slice, rows: RowBuffers, seq_len: torch.Tensor, accepted_len: torch.Tensor,
             drafted_len: torch.Tensor) -> None:
        """Roll back to the kept prefix: the row's old tokens plus the accepted drafts it has fed (the
        cache never holds the last draft, so `min` also covers a full acceptance and rows not drafted)."""
        self.runner.rollback(live, torch.minimum(self.runner.cache.lens[live], seq_len + accepted_len))

    def prefill(self, slots: torch.Tensor, rows: RowBuffers, count: torch.Tensor) -> None:
        self.runner.cache.reset_rows(slots)
        if int(count.max()) > 0:
            self.runner.extend(slots, rows.tokens[slots], count)

    def move_row(self, src: int, dst: int) -> None:
        self.runner.cache.move_row(src, dst)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        copy_into(self.runner.model, state_dict, "drafter")

    def cost_key(self) -> str:
        return model_cost_key(self.runner)

    def time_drafts(self, batch_sizes: list[int], deadline: float) -> ForwardTimes:
        # A draft costs its forward plus turning the logits into a sampled token (T = 1, the dearer
        # mode): for small drafters, and on GPUs where small kernels are launch-bound, that is no
        # rounding error.
        def sample(logits: torch.Tensor) -> torch.Tensor:
            return gumbel_max(process_logits(logits[:, -1], DRAFT_PARAMS), draft_noise(logits))

        return time_forwards(self.runner, batch_sizes, [1, 2], deadline, then=sample)

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Drafter logits over the target's ids: extra drafter rows dropped, missing ones at -inf."""
        extra = self.target_vocab_size - logits.shape[-1]
        if extra < 0:
            return logits[..., : self.target_vocab_size]
        if extra > 0:
            return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))
        return logits


def time_host_drafts(propose_rows: Callable[[int], object], batch_sizes: list[int], deadline: float,
                     repeats: int = 5) -> ForwardTimes:
    """`time_drafts` for a drafter that proposes all γ drafts in one host call (`propose_rows(batch)`):
    the call's time in the catch-up column, ~nothing per further draft."""
    times = []
    for batch in batch_sizes:
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            propose_rows(batch)
            samples.append(time.perf_counter() - started)
            if time.perf_counter() > deadline:
                break
        best = min(samples)
        times.append([1e-7, max(best, 1e-7)])
    return ForwardTimes(list(batch_sizes), [1, 2], times)
