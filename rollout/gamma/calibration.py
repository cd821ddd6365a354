"""Calibration: the target's and drafter's forward times and the sampling of verified positions, measured on the
running hardware (or loaded from the on-disk cache), into a `cost_model.CostModel`.

`calibrate` times target and drafter forwards through their ragged caches over a grid of live batch sizes and
query lengths (every point at least twice, more rounds within `budget_s` seconds; the fastest run per point), and
the sampling a verified position costs (`models.timing.SamplingTimes`). The result is cached on disk per model
shape, weight layout, device, dtype and thread count, so a restarted engine does not measure again. A cached file
that is not a calibration (cut short, edited) is a `ValueError` naming it, never a silent re-measure.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..drafters.protocol import Drafter
from ..models.runner import ModelRunner
from ..models.timing import (
    CALIBRATION_CONTEXT,
    ForwardTimes,
    SamplingTimes,
    after_a_target_forward,
    model_cost_key,
    one_token_forward,
    time_forwards,
    time_sampling,
)
from .cost_model import CostModel

# The target is timed at CALIBRATION_CONTEXT tokens of context and again at this many (the model
# interpolates in between, extrapolates past).
LONG_CONTEXT = 512


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


def calibrate(target: ModelRunner, drafter: Drafter, max_batch: int, max_gamma: int, budget_s: float,
              cache_dir: str | None = None, max_query: int | None = None) -> CostModel:
    """Measure (or load from the on-disk cache) target and drafter forward times.

    The target is timed at two cached-context lengths, `CALIBRATION_CONTEXT` and up to
    `LONG_CONTEXT` (as far as the cache allows): attention over a long ragged batch reads every
    row's K/V up to the longest row, which at rollout lengths costs as much as the matrix products.
    The drafter times its own drafts (`Drafter.time_drafts`). `max_query`: time the target up to that many
    tokens per row too (a tree's 1 + γ·w, `tree`; None: a chain's γ + 1). The chains' part is the chain
    calibration itself (the same cache file): an engine with trees chooses its chains on the very times an engine
    without them does (measured apart, the two calibrations' noise alone made the tree engine's chains 0.87× at a
    full batch on the demo models); the wider query lengths are timed once more at the short context and
    cached beside it.
    """
    chain = _calibrate_chains(target, drafter, max_batch, max_gamma, budget_s, cache_dir)
    chain.sampling = _calibrate_sampling(target, drafter, max_batch, max_gamma, chain.target.batch_sizes, budget_s,
                                         cache_dir)
    top = max(max_query or 0, max_gamma + 1)
    if top == max_gamma + 1:
        return chain
    path = _cache_path(target, drafter, max_batch, max_gamma, cache_dir, f"-wide{top}")
    lens = [q for q in _query_grid(top - 1) if q > max_gamma + 1]
    if path.exists():
        wide = _load_times(path)
    else:
        wide = time_forwards(target, chain.target.batch_sizes, lens, time.perf_counter() + budget_s / 2)
        _write_json(path, asdict(wide))
    if wide.batch_sizes != chain.target.batch_sizes or wide.query_lens != lens:
        raise ValueError(f"calibration cache {path} is for other batch sizes or query lengths; delete it to measure "
                         "again")
    merged = ForwardTimes(chain.target.batch_sizes, chain.target.query_lens + lens,
                          [row + extra for row, extra in zip(chain.target.times, wide.times)])
    return CostModel(target=merged, drafter=chain.drafter, target_long=chain.target_long, contexts=chain.contexts,
                     sampling=chain.sampling)


def _calibrate_sampling(target: ModelRunner, drafter: Drafter, max_batch: int, max_gamma: int,
                        batch_sizes: list[int], budget_s: float, cache_dir: str | None) -> SamplingTimes:
    """The sampling of verified positions (`SamplingTimes`) at the target's vocabulary, cached beside the chain
    calibration (a tenth of its budget: ~1 s for the subword demo's 32,768 ids on a 2-core CPU)."""
    path = _cache_path(target, drafter, max_batch, max_gamma, cache_dir, "-sampling")
    if path.exists():
        try:
            times = SamplingTimes(**json.loads(path.read_text()))
            if times.batch_sizes == batch_sizes and all(
                    len(v) == len(batch_sizes) and all(isinstance(t, (int, float)) and math.isfinite(t) for t in v)
                    for v in (times.greedy_token, times.sampled_token, times.noise)):
                return times
        except (ValueError, TypeError) as err:
            raise ValueError(f"calibration cache {path} cannot be read (truncated, or not sampling times): {err!r}; "
                             "delete it to measure again") from err
        raise ValueError(f"calibration cache {path} is for other batch sizes; delete it to measure again")
    times = time_sampling(target.vocab_size, batch_sizes, target.device, time.perf_counter() + budget_s / 10)
    _write_json(path, asdict(times))
    return times


def _calibrate_chains(target: ModelRunner, drafter: Drafter, max_batch: int, max_gamma: int, budget_s: float,
                      cache_dir: str | None) -> CostModel:
    top = max_gamma + 1
    path = _cache_path(target, drafter, max_batch, max_gamma, cache_dir)
    if path.exists():
        return _load(path)
    batch_sizes = _grid(max_batch)
    query_lens = _query_grid(top - 1)
    coarse = [q for q in query_lens if q <= 3 or (q - 1) & (q - 2) == 0 or q == query_lens[-1]]  # 1, 2, 3, 5, 9, …
    long_context = min(LONG_CONTEXT, target.cache.length - max_gamma - 2)
    two = long_context >= 2 * CALIBRATION_CONTEXT
    now = time.perf_counter()
    with after_a_target_forward(one_token_forward(target)):  # a step's first draft follows the target's forward
        drafter_times = drafter.time_drafts(batch_sizes, now + budget_s * 0.2)
    target_times = time_forwards(target, batch_sizes, query_lens, now + budget_s * (0.6 if two else 1.0))
    target_long = None
    if two:
        target_long = time_forwards(target, batch_sizes, coarse, now + budget_s, context=long_context)
    contexts = (CALIBRATION_CONTEXT, long_context if two else CALIBRATION_CONTEXT)
    model = CostModel(target=target_times, drafter=drafter_times, target_long=target_long, contexts=contexts)
    _write_json(path, {"target": asdict(target_times), "drafter": asdict(drafter_times),
                       "target_long": asdict(target_long) if target_long else None, "contexts": list(contexts)})
    return model


def _write_json(path: Path, data: dict) -> None:
    """Written aside, then renamed: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _load_times(path: Path) -> ForwardTimes:
    """A cached `ForwardTimes` (the wide query lengths), checked as `_load` checks a cost model."""
    try:
        return _forward_times(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"calibration cache {path} cannot be read (truncated, or not forward times): {err!r}; "
                         "delete it to measure again") from err


def _default_cache_dir() -> str:
    root = os.environ.get("SPECROLL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specroll")
    return os.path.join(root, "cost_model")


def _cache_path(target: ModelRunner, drafter: Drafter, max_batch: int, max_gamma: int, cache_dir: str | None,
                suffix: str = "") -> Path:
    """The cache file of a calibration (`suffix`: of its wide query lengths, or of its sampling)."""
    device = target.device
    hw = f"{device}|{torch.get_num_threads()}|{torch.__version__}"
    if device.type == "cuda":
        hw += torch.cuda.get_device_name(device)
    raw = "|".join(["v6", model_cost_key(target), drafter.cost_key(), str(max_batch), str(max_gamma), hw])
    return Path(cache_dir or _default_cache_dir()) / f"{hashlib.sha256(raw.encode()).hexdigest()[:20]}{suffix}.json"


def _load(path: Path) -> CostModel:
    """The cost model cached at `path`, checked as a checkpoint is: a file cut short (a crash while another
    process wrote it), edited or of another layout is a `ValueError` naming the path (delete it to measure
    again); a file that cannot be opened raises its `OSError`."""
    try:
        data = json.loads(path.read_text())
        long = _forward_times(data["target_long"]) if data.get("target_long") else None
        contexts = tuple(int(c) for c in data["contexts"])
        if len(contexts) != 2:
            raise ValueError(f"contexts={data['contexts']!r}: two context lengths expected")
        return CostModel(target=_forward_times(data["target"]), drafter=_forward_times(data["drafter"]),
                         target_long=long, contexts=contexts)
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # JSON and Unicode errors are ValueErrors
        raise ValueError(f"calibration cache {path} cannot be read (truncated, or not a cost model): {err!r}; "
                         "delete it to measure again") from err


def _forward_times(raw: dict) -> ForwardTimes:
    """A `ForwardTimes` from its JSON fields, whose grid must be complete: a time per (batch, query) point."""
    times = ForwardTimes(**raw)
    rows, cols = len(times.batch_sizes), len(times.query_lens)
    if not rows or not cols or len(times.times) != rows or any(len(row) != cols for row in times.times):
        raise ValueError(f"an incomplete grid of times for {rows} batch sizes × {cols} query lengths")
    if not all(isinstance(t, (int, float)) and math.isfinite(t) for row in times.times for t in row):
        raise ValueError("times must be finite numbers")
    return times
