"""Forward-time cost model measured on the running hardware, for choosing γ.

`calibrate` times target and drafter forwards through their ragged caches over a grid of live
batch sizes and query lengths (≤ `budget_s` seconds, fastest of a few runs per point) and
`CostModel` interpolates that grid piecewise-linearly. The result is cached on disk per model shape,
weight layout, device, dtype and thread count, so a restarted engine does not measure again. What a
real step costs beyond these forwards the γ policy learns online (`gamma_rate.RateGamma`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .config import SamplingParams
from .randomness import Purpose, gumbel
from .runner import ModelRunner

if TYPE_CHECKING:
    from .drafter import Drafter

CALIBRATION_CONTEXT = 64  # tokens already in the cache while timing ...
DRAFT_PARAMS = SamplingParams(max_new_tokens=1, temperature=1.0)
LONG_CONTEXT = 512  # ... and again at this many (the model interpolates in between, extrapolates past)


@dataclass
class ForwardTimes:
    """Median seconds of one forward, `times[i][j]` at batch `batch_sizes[i]` and query `query_lens[j]`."""

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


@dataclass
class CostModel:
    """Calibrated forward times: the target's (interpolated in the KV length between the two
    calibrated contexts) and the drafter's."""

    target: ForwardTimes  # at `contexts[0]` tokens already cached
    drafter: ForwardTimes
    target_long: ForwardTimes | None = None  # at `contexts[1]`; None: context-independent
    contexts: tuple[int, int] = (CALIBRATION_CONTEXT, CALIBRATION_CONTEXT)

    def context_weight(self, context: int) -> float:
        """Where `context` lies between the two calibrated contexts (0 at the short one; the time is
        linear in the KV length the attention reads, and extrapolated past the long one)."""
        lo, hi = self.contexts
        if self.target_long is None or hi <= lo:
            return 0.0
        return max(0.0, (context - lo) / (hi - lo))

    def target_parts(self, batch: int, query_len: int) -> tuple[float, float]:
        """(seconds at the short context, seconds the long context adds): the forward's time at any
        context is `short + context_weight(context) * added`."""
        long = self.target_long
        short = self.target(batch, query_len)
        if long is None or self.contexts[1] <= self.contexts[0]:
            return short, 0.0
        # The long context is timed on a coarser query grid: the staircase in the query length comes
        # from the matrix products (the short table has every step of it), while what the longer
        # context adds — attention over the cached K/V — grows smoothly, so it is interpolated.
        return short, long(batch, query_len) - self.target.at(long.query_lens)(batch, query_len)

    def target_time(self, batch: int, query_len: int, context: int = CALIBRATION_CONTEXT) -> float:
        short, added = self.target_parts(batch, query_len)
        return max(short + self.context_weight(context) * added, 1e-7)

    def draft_time(self, batch: int, gamma: int) -> float:
        """Calibrated seconds of γ drafts: a catch-up forward of up to two tokens, then γ - 1 of one."""
        return self.drafter(batch, 2) + (gamma - 1) * self.drafter(batch, 1) if gamma else 0.0


def _query_grid(max_gamma: int) -> list[int]:
    """Every query length a step can use up to 9 (γ ≤ 8), then doubling to max_gamma + 1.

    Forward time is a staircase in the query length on CPUs (and GPUs): the matrix kernels work in
    blocks, so one more token costs nothing or a whole block. Measured on this project's CPU (demo
    target, 16 rows, 400 tokens of context): 58.1, 67.6, 67.6, 72.3 ms at 3, 4, 5, 6 tokens — linear
    interpolation between 3 and 5 put 4 tokens 7% too cheap, and elsewhere the grid [1, 2, 3, 5, 9]
    erred by up to 16%, several times the few percent that separate the γ near the best.
    """
    top = max_gamma + 1
    lens = list(range(1, min(top, 9) + 1))
    while lens[-1] < top:
        lens.append(min(2 * lens[-1] - 1, top))
    return lens


def _grid(max_batch: int) -> list[int]:
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 4 if b >= 4 else 2
    return [*sizes, max_batch]


@torch.inference_mode()
def time_forwards(runner: ModelRunner, batch_sizes: list[int], query_lens: list[int], deadline: float,
                  repeats: int = 5, point_budget_s: float = 0.4, context: int = CALIBRATION_CONTEXT,
                  then: Callable[[torch.Tensor], object] | None = None) -> ForwardTimes:
    """Fastest forward time per (batch, query) on the runner's own cache; stops early at `deadline`
    and extrapolates the missing large batches linearly from the measured ones. `then(logits)`, if
    given, is timed with the forward (the drafter's sampling of each draft).

    The minimum of up to `repeats` runs (at least 2, within `point_budget_s` per point), not the
    median: on a shared machine the noise is other work, which only ever adds time.
    """
    device = runner.device
    times: list[list[float]] = []
    for batch in batch_sizes:
        rows = slice(0, batch)
        runner.rollback(rows, torch.full((batch,), context, dtype=torch.long, device=device))
        row_times = []
        for q in query_lens:
            ids = torch.zeros(batch, q, dtype=torch.long, device=device)
            start = runner.cache.lens[rows]
            samples = []
            point_started = time.perf_counter()
            for i in range(repeats + 1):  # the first run warms up
                t0 = time.perf_counter()
                logits = runner.forward(rows, ids, start)
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
    runner.rollback(slice(None), torch.zeros_like(runner.cache.lens))
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


def calibrate(target: ModelRunner, drafter: Drafter, max_batch: int, max_gamma: int, budget_s: float,
              cache_dir: str | None = None) -> CostModel:
    """Measure (or load from the on-disk cache) target and drafter forward times.

    The target is timed at two cached-context lengths, `CALIBRATION_CONTEXT` and up to
    `LONG_CONTEXT` (as far as the cache allows): attention over a long ragged batch reads every
    row's K/V up to the longest row, which at rollout lengths costs as much as the matrix products.
    The drafter times its own drafts (`Drafter.time_drafts`).
    """
    key = _cache_key(target, drafter, max_batch, max_gamma)
    path = Path(cache_dir or _default_cache_dir()) / f"{key}.json"
    if path.exists():
        data = json.loads(path.read_text())
        long = ForwardTimes(**data["target_long"]) if data.get("target_long") else None
        return CostModel(target=ForwardTimes(**data["target"]), drafter=ForwardTimes(**data["drafter"]),
                         target_long=long, contexts=tuple(data["contexts"]))
    batch_sizes = _grid(max_batch)
    query_lens = _query_grid(max_gamma)
    coarse = [q for q in query_lens if q <= 3 or (q - 1) & (q - 2) == 0 or q == query_lens[-1]]  # 1, 2, 3, 5, 9, …
    long_context = min(LONG_CONTEXT, target.cache.length - max_gamma - 2)
    two = long_context >= 2 * CALIBRATION_CONTEXT
    now = time.perf_counter()
    drafter_times = drafter.time_drafts(batch_sizes, now + budget_s * 0.2)
    target_times = time_forwards(target, batch_sizes, query_lens, now + budget_s * (0.6 if two else 1.0))
    target_long = None
    if two:
        target_long = time_forwards(target, batch_sizes, coarse, now + budget_s, context=long_context)
    contexts = (CALIBRATION_CONTEXT, long_context if two else CALIBRATION_CONTEXT)
    model = CostModel(target=target_times, drafter=drafter_times, target_long=target_long, contexts=contexts)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"target": asdict(target_times), "drafter": asdict(drafter_times),
                               "target_long": asdict(target_long) if target_long else None,
                               "contexts": list(contexts)}))
    tmp.replace(path)
    return model


def _default_cache_dir() -> str:
    root = os.environ.get("SPECROLL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specroll")
    return os.path.join(root, "cost_model")


def model_cost_key(runner: ModelRunner) -> str:
    """What a model's forward time depends on: its config, dtype and forward path."""
    cfg = runner.model.config.to_dict()
    cfg.pop("_name_or_path", None)
    cfg.pop("transformers_version", None)
    dtype = next(runner.model.parameters()).dtype
    forward = f"lean-{runner.lean.layout}" if runner.lean is not None else "hf"  # they cost differently
    return json.dumps(cfg, sort_keys=True, default=str) + str(dtype) + forward


def _cache_key(target: ModelRunner, drafter: Drafter, max_batch: int, max_gamma: int) -> str:
    device = target.device
    hw = f"{device}|{torch.get_num_threads()}|{torch.__version__}"
    if device.type == "cuda":
        hw += torch.cuda.get_device_name(device)
    raw = "|".join(["v4", model_cost_key(target), drafter.cost_key(), str(max_batch), str(max_gamma), hw])
    return hashlib.sha256(raw.encode()).hexdigest()[:20]
