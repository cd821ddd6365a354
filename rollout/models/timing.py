"""Every timing helper: how long a model forward, or a drafter's drafts, take on the running hardware.

`time_forwards` times a `ModelRunner` through its own ragged cache over a grid of live batch sizes and query
lengths; `time_draft_calls` and `time_host_drafts` time a drafter's draft call (a head's, or a host lookup's).
Each returns a `ForwardTimes` grid, the fastest of a few runs per point, which interpolates piecewise-linearly
in between. The γ policies' cost model (`gamma.cost_model`) is built from them, and each drafter's
`time_drafts` (`drafters.protocol.Drafter`) is one of them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import SamplingParams
from ..sampling.randomness import Purpose, gumbel
from .runner import ModelRunner

CALIBRATION_CONTEXT = 64  # tokens already in the cache while timing
DRAFT_PARAMS = SamplingParams(max_new_tokens=1, temperature=1.0)  # a timed draft samples at T = 1, the dearer mode


@dataclass
class ForwardTimes:
    """Seconds of one forward (or draft call), `times[i][j]` at batch `batch_sizes[i]` and query `query_lens[j]`:
    at each point the fastest of the timed runs — their minimum, not the median (on a shared machine the noise
    is other work, which only ever adds time); batch sizes past a timing deadline extrapolated."""

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
                  repeats: int = 5, point_budget_s: float = 0.4, context: int = CALIBRATION_CONTEXT,
                  then: Callable[[torch.Tensor], object] | None = None,
                  head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> ForwardTimes:
    """Fastest forward time per (batch, query) on the runner's own cache; stops early at `deadline`
    and extrapolates the missing large batches linearly from the measured ones. `then(logits)`, if
    given, is timed with the forward (the drafter's sampling of each draft); `head` replaces the LM head
    (a draft vocabulary's, `ModelRunner.forward`).

    The minimum of up to `repeats` runs (at least 2, within `point_budget_s` per point), not the
    median: on a shared machine the noise is other work, which only ever adds time.
    """
    device = runner.device
    times: list[list[float]] = []
    for batch in batch_sizes:
        rows = slice(0, batch)
        runner.rollback(rows, torch.full((batch,), context, dtype=torch.long, device=device), [context] * batch)
        row_times = []
        for q in query_lens:
            ids = torch.zeros(batch, q, dtype=torch.long, device=device)
            start = runner.cache.lens[rows]
            samples = []
            point_started = time.perf_counter()
            for i in range(repeats + 1):  # the first run warms up
                t0 = time.perf_counter()
                logits = runner.forward(rows, ids, start, head=head, host_start=[context] * batch)
                if then is not None:
                    then(logits)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                samples.append(time.perf_counter() - t0)
                if i >= 2 and time.perf_counter() - point_started > point_budget_s:
                    break
            row_times.append(min(samples[1:]))
        times.append(row_times)
        if time.perf_counter() > deadline and len(times) >= 2:
            break
    measured = batch_sizes[: len(times)]
    runner.rollback(slice(None), torch.zeros_like(runner.cache.lens), [0] * len(runner.cache.host_lens))
    runner.num_forwards = 0
    partial = ForwardTimes(measured, query_lens, _monotone(times))
    return ForwardTimes(batch_sizes, query_lens, _monotone([[partial(b, q) for q in query_lens] for b in batch_sizes]))


def _monotone(times: list[list[float]]) -> list[list[float]]:
    """More rows or more tokens never take less time: a noisy dip (or a noisy extrapolation to batch
    sizes the budget left unmeasured) would make the policy chase it."""
    for row in times:
        for j in range(1, len(row)):
            row[j] = max(row[j], row[j - 1])
    for i in range(1, len(times)):
        times[i] = [max(t, below) for t, below in zip(times[i], times[i - 1])]
    return times


def draft_noise(logits: torch.Tensor) -> torch.Tensor:
    """The Gumbel noise [n, V] a sampled draft computes from logits [n, Q, V] (its values do not matter here)."""
    zeros = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return gumbel(zeros, zeros[:, None], Purpose.TOKEN, logits.shape[-1])[:, 0]


def time_draft_calls(draft: Callable[[int, int], object], batch_sizes: list[int], deadline: float,
                     device: torch.device, repeats: int = 5) -> ForwardTimes:
    """`Drafter.time_drafts` for a drafter whose draft at batch b and query length Q is `draft(b, Q)`:
    the fastest of `repeats` calls per point (the first warms up); unmeasured batch sizes past the
    deadline are extrapolated linearly from the last two measured."""
    times: list[list[float]] = []
    for batch in batch_sizes:
        row = []
        for query_len in (1, 2):
            samples = []
            for _ in range(repeats + 1):
                started = time.perf_counter()
                draft(batch, query_len)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                samples.append(time.perf_counter() - started)
            row.append(max(min(samples[1:]), 1e-7))
        times.append([row[0], max(row)])
        if time.perf_counter() > deadline and len(times) >= 2:
            break
    while len(times) < len(batch_sizes):
        (b0, t0), (b1, t1) = zip(batch_sizes[len(times) - 2 : len(times)], times[-2:])
        b = batch_sizes[len(times)]
        times.append([y1 + (y1 - y0) * (b - b1) / max(b1 - b0, 1) for y0, y1 in zip(t0, t1)])
    return ForwardTimes(list(batch_sizes), [1, 2], times)


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


def model_cost_key(runner: ModelRunner) -> str:
    """What a model's forward time depends on: its config, dtype and forward path."""
    cfg = runner.model.config.to_dict()
    cfg.pop("_name_or_path", None)
    cfg.pop("transformers_version", None)
    dtype = next(runner.model.parameters()).dtype
    forward = f"lean-{runner.lean.layout}" if runner.lean is not None else "hf"  # they cost differently
    return json.dumps(cfg, sort_keys=True, default=str) + str(dtype) + forward
