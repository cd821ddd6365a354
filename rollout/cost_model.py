"""Forward-time cost model measured on the running hardware, for choosing γ.

`calibrate` times target and drafter forwards through their ragged caches over a grid of live
batch sizes and query lengths (≤ `budget_s` seconds, fastest of a few runs per point) and
`CostModel` interpolates that grid piecewise-linearly. The result is cached on disk per model shape,
weight layout, device, dtype and thread count, so a restarted engine does not measure again. The
engine then refines it online from the steps it runs (`CostModel.observe`): a measured slow-down of
the drafts and a measured per-step overhead on top of the target's forward.

Over ~300 lines, one concept (what a step costs on this hardware): the calibration, its cache and
`AutoGamma`'s online corrections; the timing helpers are what every drafter's `time_drafts` uses.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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
OFFSET_MEMORY = 100  # steps (at one batch size) over which a per-γ overhead offset fades when γ is not run


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
    """Predicted step times: the target's forward (interpolated in the KV length between the two
    calibrated contexts) plus the step's measured overhead, and γ drafter forwards times their
    measured slow-down.

    Measured on this project's CPU (demo models), a step differs from its calibrated forwards in two
    ways that do not share one factor: each draft costs ~2× its calibrated forward at every batch
    size and γ (a small model's weights and activations fall out of the caches while the target
    runs), while the verification part costs its forward plus a per-step overhead that hardly
    depends on γ (+4–9 ms at 1 row, +11–16 ms at 16: sampling, verification, bookkeeping, colder
    weights). One factor for the whole step made each extra query token look up to 1.4× dearer than
    it is and the policy drafted too little; hence a multiplicative correction for the drafts and an
    additive one, per live batch size, for the rest.
    """

    target: ForwardTimes  # at `contexts[0]` tokens already cached
    drafter: ForwardTimes
    target_long: ForwardTimes | None = None  # at `contexts[1]`; None: context-independent
    contexts: tuple[int, int] = (CALIBRATION_CONTEXT, CALIBRATION_CONTEXT)
    draft_scale: float | None = None  # measured / calibrated drafting time; None until measured
    overhead: dict[int, float] = field(default_factory=dict)  # live rows → step seconds beyond the forwards
    overhead_offsets: dict[int, list[float]] = field(default_factory=dict)  # live rows → per-γ offsets from it
    ema: float = 0.8

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

    def raw_step_time(self, batch: int, gamma: int, context: int = CALIBRATION_CONTEXT) -> tuple[float, float]:
        """Calibrated (verify, draft) seconds of a step with γ drafts for `batch` live rows."""
        return self.target_time(batch, gamma + 1, context), self.draft_time(batch, gamma)

    def step_overheads(self, batch: int, max_gamma: int) -> list[float]:
        """Measured seconds a step spends beyond its calibrated forwards at `batch` live rows, for
        γ = 0..max_gamma: the batch size's (the nearest measured one's; 0 before any step) plus each
        (batch, γ)'s own offset where one was measured."""
        if batch in self.overhead:
            pooled = self.overhead[batch]
        elif self.overhead:
            pooled = self.overhead[min(self.overhead, key=lambda b: abs(b - batch))]
        else:
            pooled = 0.0
        offsets = self.overhead_offsets.get(batch)
        if offsets is None:
            return [pooled] * (max_gamma + 1)
        return [pooled + (offsets[g] if g < len(offsets) else 0.0) for g in range(max_gamma + 1)]

    def corrected(self, batch: int, verify: list[float], draft: list[float]) -> list[float]:
        """Predicted step seconds for γ = 0, 1, … from their calibrated (verify, draft) parts."""
        overheads, scale = self.step_overheads(batch, len(verify) - 1), self.draft_scale or 1.0
        return [v + o + scale * d for v, o, d in zip(verify, overheads, draft)]

    def step_time(self, batch: int, gamma: int, context: int = CALIBRATION_CONTEXT) -> float:
        """Predicted seconds of one engine step with γ drafts for `batch` live rows."""
        parts = [self.raw_step_time(batch, g, context) for g in range(gamma + 1)]
        return self.corrected(batch, [v for v, _ in parts], [d for _, d in parts])[gamma]

    def observe(self, batch: int, gamma: int, seconds: float, context: int = CALIBRATION_CONTEXT,
                draft_seconds: float | None = None, predicted: tuple[float, float] | None = None) -> None:
        """Fold one measured step into the corrections. `draft_seconds`: the part of `seconds` spent
        drafting (None: unknown, taken as predicted); `predicted`: the step's `raw_step_time`, if the
        caller has it at hand."""
        verify, draft = predicted or self.raw_step_time(batch, gamma, context)
        if draft_seconds is None:
            draft_seconds = (self.draft_scale or 1.0) * draft
        elif gamma:
            ratio = draft_seconds / draft
            old = self.draft_scale
            # One stalled step (GC, another process) must not make drafting look dear for good.
            if old is not None:
                ratio = self.ema * old + (1 - self.ema) * min(max(ratio, old / 2), old * 2)
            self.draft_scale = ratio
        extra = seconds - draft_seconds - verify
        old = self.overhead.get(batch)
        if old is None:
            self.overhead[batch] = extra
            return
        extra = min(max(extra, -verify / 2), 2 * max(old, 0.0) + verify / 10)  # ... nor a step look slow
        self.overhead[batch] = self.ema * old + (1 - self.ema) * extra
        # The calibrated forwards get the growth with γ right only to a few ms (e.g. one row at 450
        # tokens of context: 3.3 ms over for γ = 0, 0.4 ms for γ = 4), so each (batch, γ) also learns
        # an offset from the batch size's overhead; offsets of γ not run fade (memory ~OFFSET_MEMORY
        # steps at that batch size), so one unlucky measurement cannot rule a γ out for good.
        offsets = self.overhead_offsets.setdefault(batch, [0.0] * (gamma + 1))
        if len(offsets) <= gamma:
            offsets.extend([0.0] * (gamma + 1 - len(offsets)))
        fade = 1.0 - 1.0 / OFFSET_MEMORY
        for g in range(len(offsets)):
            if g != gamma:
                offsets[g] *= fade
        offsets[gamma] = self.ema * offsets[gamma] + (1 - self.ema) * (extra - self.overhead[batch])


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
