"""Every timing helper: how long a model forward, or a drafter's drafts, take on the running hardware.

`time_forwards` times a `ModelRunner` through its own ragged cache over a grid of live batch sizes and query
lengths; `time_draft_calls` and `time_host_drafts` time a drafter's draft call (a head's, or a host lookup's).
Each returns a `ForwardTimes` grid, the fastest of a few runs per point, which interpolates piecewise-linearly
in between. The γ policies' cost model (`gamma.cost_model`) is built from them, and each drafter's
`time_drafts` (`drafters.protocol.Drafter`) is one of them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from ..config import SamplingParams
from ..sampling.logits import process_logits
from ..sampling.randomness import Purpose, gumbel
from .runner import ModelRunner

CALIBRATION_CONTEXT = 64  # tokens already in the cache while timing
MIN_ROUNDS = 2  # timed runs of every grid point, whatever the deadline
DRAFT_PARAMS = SamplingParams(max_new_tokens=1, temperature=1.0)  # a timed draft samples at T = 1, the dearer mode
CATCH_UP = 2  # a drafter's timed query length of its first draft in a step (`Drafter.time_drafts`)
_BEFORE_CATCH_UP: ContextVar[Callable[[int], object] | None] = ContextVar("before_catch_up", default=None)


@contextmanager
def after_a_target_forward(forward: Callable[[int], object]) -> Iterator[None]:
    """Within it, `_fastest` runs `forward(batch)` (untimed) before each timed call at the catch-up query length:
    a step's first draft runs right after the target's forward, which has pushed the drafter's weights out of the
    caches. Measured on a 2-core EPYC (the subword demo's drafter LM): 1.5-1.7x its time in a tight loop at 4-32
    rows; timed alone, the prior of the drafts' slow-down (`CostModel.draft_scale`) was off by that much."""
    token = _BEFORE_CATCH_UP.set(forward)
    try:
        yield
    finally:
        _BEFORE_CATCH_UP.reset(token)


@dataclass
class ForwardTimes:
    """Seconds of one forward (or draft call), `times[i][j]` at batch `batch_sizes[i]` and query `query_lens[j]`:
    at each point the fastest of the timed runs — their minimum, not the median (on a shared machine the noise
    is other work, which only ever adds time). Every grid point is measured (`time_forwards`)."""

    batch_sizes: list[int]
    query_lens: list[int]
    times: list[list[float]]

    def at(self, query_lens: list[int]) -> ForwardTimes:
        """The same times on a coarser query grid (a subset of this one's)."""
        if query_lens == self.query_lens:
            return self
        cols = [self.query_lens.index(q) for q in query_lens]
        return ForwardTimes(self.batch_sizes, list(query_lens), [[row[j] for j in cols] for row in self.times])

    def __call__(self, batch: int, query_len: int) -> float:
        i0, i1, wb = _bracket(self.batch_sizes, batch)
        j0, j1, wq = _bracket(self.query_lens, query_len)
        row = lambda i: (1 - wq) * self.times[i][j0] + wq * self.times[i][j1]
        return max((1 - wb) * row(i0) + wb * row(i1), 1e-7)


def _bracket(grid: list[int], x: float) -> tuple[int, int, float]:
    """Indices around x and the interpolation weight; extrapolates linearly past the ends."""
    if len(grid) == 1:
        return 0, 0, 0.0
    hi = next((k for k, g in enumerate(grid) if g >= x), len(grid) - 1)
    hi = max(hi, 1)
    lo = hi - 1
    return lo, hi, (x - grid[lo]) / (grid[hi] - grid[lo])


def runs_async(device: torch.device) -> bool:
    """Whether `device` runs kernels asynchronously to the host (a host clock then needs a sync to time them)."""
    return device.type == "cuda"


@torch.inference_mode()
def time_forwards(runner: ModelRunner, batch_sizes: list[int], query_lens: list[int], deadline: float,
                  repeats: int = 5, context: int = CALIBRATION_CONTEXT,
                  then: Callable[[torch.Tensor], object] | None = None,
                  head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> ForwardTimes:
    """Fastest forward time per (batch, query) on the runner's own cache, `context` tokens already cached
    (`_fastest`: every point measured, whatever the deadline). `then(logits)`, if given, is timed with the forward
    (the drafter's sampling of each draft); `head` replaces the LM head (a draft vocabulary's, `ModelRunner.forward`).
    """
    device = runner.device

    def call(batch: int, q: int) -> None:
        rows = slice(0, batch)
        ids = torch.zeros(batch, q, dtype=torch.long, device=device)
        logits = runner.forward(rows, ids, runner.cache.lens[rows], head=head, host_start=[context] * batch)
        if then is not None:
            then(logits)

    best = _fastest(call, batch_sizes, query_lens, deadline, repeats, device,
                    lambda batch: _place(runner, batch, context))
    runner.rollback(slice(None), torch.zeros_like(runner.cache.lens), [0] * len(runner.cache.host_lens))
    runner.num_forwards = 0
    return ForwardTimes(list(batch_sizes), list(query_lens), _monotone(best))


def one_token_forward(runner: ModelRunner, context: int = CALIBRATION_CONTEXT) -> Callable[[int], None]:
    """`forward(batch)`: one token through `runner` for its first `batch` rows, `context` tokens cached (for
    `after_a_target_forward`; the caller resets the cache after, as `time_forwards` does)."""
    @torch.inference_mode()
    def forward(batch: int) -> None:
        _place(runner, batch, context)
        rows = slice(0, batch)
        runner.forward(rows, torch.zeros(batch, 1, dtype=torch.long, device=runner.device), runner.cache.lens[rows],
                       host_start=[context] * batch)

    return forward


def _place(runner: ModelRunner, batch: int, context: int) -> None:
    """The first `batch` rows of `runner`'s cache set to `context` tokens (a timed forward's starting point)."""
    runner.rollback(slice(0, batch), torch.full((batch,), context, dtype=torch.long, device=runner.device),
                    [context] * batch)


def _fastest(call: Callable[[int, int], object], batch_sizes: list[int], query_lens: list[int], deadline: float,
             repeats: int, device: torch.device, place: Callable[[int], None] = lambda batch: None
             ) -> list[list[float]]:
    """The fastest seconds of `call(batch, q)` at every grid point, whatever the deadline: a warm-up per batch
    size (its shortest and longest query; a new shape's first call allocates), then rounds over the whole grid,
    `MIN_ROUNDS` and more while `deadline` is ahead (`repeats` at most; one run reads up to ~20% high on a 2-core
    CPU). Rounds sweep the grid rather than repeat a point, so a burst of other work on a shared machine lands on
    a few points of several rows, not on one point's every run; each point keeps its minimum, not the median:
    that noise only ever adds time. `place(batch)` readies a batch size before its points run.

    Cutting the grid at the deadline and extrapolating the larger batch sizes from the two measured last, as the
    calibration did before, put the demo target's 16- and 48-row forwards at 2-3x their time on a 2-core CPU (the
    slope from 2 to 4 rows is steeper than past 16): verification looked free at a full batch."""

    before = _BEFORE_CATCH_UP.get()

    def timed(batch: int, q: int) -> float:
        if before is not None and q == CATCH_UP:
            before(batch)
            if runs_async(device):
                torch.cuda.synchronize(device)
        started = time.perf_counter()
        call(batch, q)
        if runs_async(device):
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    for batch in batch_sizes:
        place(batch)
        for q in {query_lens[0], query_lens[-1]}:
            timed(batch, q)
    best = [[math.inf] * len(query_lens) for _ in batch_sizes]
    for round_ in range(max(repeats, MIN_ROUNDS)):
        if round_ >= MIN_ROUNDS and time.perf_counter() > deadline:
            break
        for i, batch in enumerate(batch_sizes):
            place(batch)
            for j, q in enumerate(query_lens):
                best[i][j] = min(best[i][j], timed(batch, q))
    return best


def _monotone(times: list[list[float]]) -> list[list[float]]:
    """More rows or more tokens never take less time: the least-squares nondecreasing fit along the query
    length, then along the batch size (pooled adjacent violators), a running maximum last for what the second
    pass undid. A running maximum alone copies one noisy high point onto every longer query; pooling
    averages it with its neighbours instead, so that a noisy point does not make the policy chase it."""
    rows = [_pooled(row) for row in times]
    cols = [_pooled(list(col)) for col in zip(*rows)]
    out = [list(row) for row in zip(*cols)]
    for i, row in enumerate(out):
        for j in range(len(row)):
            row[j] = max(row[j], row[j - 1] if j else row[j], out[i - 1][j] if i else row[j])
    return out


def _pooled(values: list[float]) -> list[float]:
    """The nondecreasing sequence nearest `values` in squared error (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return [m for m, n in blocks for _ in range(n)]


def draft_noise(logits: torch.Tensor) -> torch.Tensor:
    """The Gumbel noise [n, V] a sampled draft computes from logits [n, Q, V] (its values do not matter here)."""
    zeros = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return gumbel(zeros, zeros[:, None], Purpose.TOKEN, logits.shape[-1])[:, 0]


def time_draft_calls(draft: Callable[[int, int], object], batch_sizes: list[int], deadline: float,
                     device: torch.device, repeats: int = 5) -> ForwardTimes:
    """`Drafter.time_drafts` for a drafter whose draft at batch b and query length Q is `draft(b, Q)`, Q = 1, 2:
    the fastest call per point, every point measured (`_fastest`)."""
    best = _fastest(draft, batch_sizes, [1, 2], deadline, repeats, device)
    return ForwardTimes(list(batch_sizes), [1, 2], [[max(t1, 1e-7), max(t1, t2, 1e-7)] for t1, t2 in best])


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


@dataclass
class SamplingTimes:
    """What verifying one more position costs beyond the target's forward, per live batch size (seconds, the
    fastest of a few runs): processing its logits into the distribution drawn from (`process_logits` over the
    vocabulary: a one-hot for greedy steps, a softmax for sampled ones) and, under the invariant sampler, its Gumbel
    noise (`randomness.gumbel`, one [rows, V] hash per position). A plain step pays one of each, a step verifying
    γ drafts γ + 1: what the calibrated forwards leave out that grows with γ (`gamma.cost_model`)."""

    batch_sizes: list[int]
    greedy_token: list[float]
    sampled_token: list[float]
    noise: list[float]

    def seconds(self, batch: int, tokens: int, positions: int, greedy: bool, invariant: bool) -> float:
        """Seconds of sampling `tokens` verified tokens at `positions` sequence positions (a chain: both γ + 1; a
        tree: every node, one position per level; a plain step: 1, 1) at `batch` rows. The rejection rule hashes
        one position per row whatever γ (the bonus or residual draw); the invariant rule every position's, counted
        for every row: on a CPU it hashes only rows still keeping drafts, so there this is an upper bound the
        online corrections bring down (`CostModel.observe`)."""
        i0, i1, w = _bracket(self.batch_sizes, batch)
        at = lambda values: max((1 - w) * values[i0] + w * values[i1], 0.0)
        if greedy:
            return tokens * at(self.greedy_token)
        return tokens * at(self.sampled_token) + (positions if invariant else 1) * at(self.noise)


@torch.inference_mode()
def time_sampling(vocab_size: int, batch_sizes: list[int], device: torch.device, deadline: float,
                  repeats: int = 5) -> SamplingTimes:
    """`SamplingTimes` measured here: `process_logits` over [b, 4, V] logits (per position: a quarter of it) in
    both modes, and one position's Gumbel noise for b rows (`_fastest`: every point, whatever the deadline)."""
    positions = 4
    # each batch size reads the first rows; drawn from a generator of its own, so that measuring (or finding a
    # cached measurement) never moves the caller's torch random stream
    logits = torch.randn(max(batch_sizes), positions, vocab_size, device=device,
                         generator=torch.Generator(device=device).manual_seed(0))
    modes = [SamplingParams(max_new_tokens=1, temperature=0.0), DRAFT_PARAMS]

    def call(batch: int, which: int) -> None:
        if which < len(modes):
            process_logits(logits[:batch], modes[which])
        else:
            draft_noise(logits[:batch])

    best = _fastest(call, batch_sizes, [0, 1, 2], deadline, repeats, device)  # the grid's "query": which part
    per_position = [_pooled([row[j] / (positions if j < len(modes) else 1) for row in best]) for j in range(3)]
    return SamplingTimes(list(batch_sizes), *per_position)


def model_cost_key(runner: ModelRunner) -> str:
    """What a model's forward time depends on: its config, dtype and forward path."""
    cfg = runner.model.config.to_dict()
    cfg.pop("_name_or_path", None)
    cfg.pop("transformers_version", None)
    dtype = next(runner.model.parameters()).dtype
    forward = f"lean-{runner.lean.layout}" if runner.lean is not None else "hf"  # they cost differently
    return json.dumps(cfg, sort_keys=True, default=str) + str(dtype) + forward
