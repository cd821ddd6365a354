"""Forward-time cost model measured on the running hardware, for choosing γ.

`calibrate` times target and drafter forwards through their ragged caches over a grid of live batch sizes and
query lengths (every point at least twice, more rounds within `budget_s` seconds; the fastest run per point) and
`CostModel` interpolates that grid piecewise-linearly. The result is cached on disk per model shape,
weight layout, device, dtype and thread count, so a restarted engine does not measure again. The
engine then refines it online from the steps it runs (`CostModel.observe`): a measured slow-down of
the drafts and a measured per-step overhead on top of the target's forward.

The timing itself is `models.timing`'s (`time_forwards`, and each drafter's `time_drafts`). A cached file
that is not a cost model (cut short, edited) is a `ValueError` naming it, never a silent re-measure.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..drafters.protocol import Drafter
from ..models.runner import ModelRunner
from ..models.timing import CALIBRATION_CONTEXT, ForwardTimes, model_cost_key, time_forwards

# The target is timed at CALIBRATION_CONTEXT tokens of context and again at this many (the model
# interpolates in between, extrapolates past).
LONG_CONTEXT = 512
OFFSET_MEMORY = 100  # steps (at one batch size) over which a per-γ overhead offset fades when γ is not run


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
    overhead: dict[int, float] = field(default_factory=dict)  # live rows → step seconds beyond the forwards (γ ≥ 1)
    plain_overhead: dict[int, float] = field(default_factory=dict)  # live rows → the same of plain steps (γ = 0)
    overhead_offsets: dict[int, list[float]] = field(default_factory=dict)  # live rows → per-γ offsets from it
    ema: float = 0.8
    _gamma_parts: dict[tuple[int, int], tuple[list[float], list[float], list[float]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def corrections_state(self) -> dict:
        """The online corrections learnt from the steps run (not the calibration), for a resumed run
        (`rollout.engine_state`): they go on adapting from there, on whatever hardware it runs."""
        return {"draft_scale": self.draft_scale, "overhead": dict(self.overhead),
                "plain_overhead": dict(self.plain_overhead),
                "overhead_offsets": {batch: list(offsets) for batch, offsets in self.overhead_offsets.items()}}

    def load_corrections_state(self, state: dict) -> None:
        scale = state["draft_scale"]
        self.draft_scale = None if scale is None else float(scale)
        self.overhead = {int(batch): float(extra) for batch, extra in state["overhead"].items()}
        # A state saved before plain steps were kept apart has none: they are learnt again from the next ones.
        self.plain_overhead = {int(batch): float(extra) for batch, extra in state.get("plain_overhead", {}).items()}
        self.overhead_offsets = {int(batch): [float(o) for o in offsets]
                                 for batch, offsets in state["overhead_offsets"].items()}

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

    def gamma_parts(self, batch: int, max_gamma: int) -> tuple[list[float], list[float], list[float]]:
        """For γ = 0..max_gamma at `batch` live rows, the calibrated parts of a step: the target's forward at the
        short context and what the long one adds (`target_parts`), and the drafts (`draft_time`). The γ policies
        ask every step, so the grid lookups are kept per (batch, max_gamma): a policy that costs a millisecond
        a step would eat a small model's gain."""
        parts = self._gamma_parts.get((batch, max_gamma))
        if parts is None:
            gammas = range(max_gamma + 1)
            target = [self.target_parts(batch, g + 1) for g in gammas]
            parts = self._gamma_parts[batch, max_gamma] = ([s for s, _ in target], [a for _, a in target],
                                                           [self.draft_time(batch, g) for g in gammas])
        return parts

    def raw_step_time(self, batch: int, gamma: int, context: int = CALIBRATION_CONTEXT) -> tuple[float, float]:
        """Calibrated (verify, draft) seconds of a step with γ drafts for `batch` live rows."""
        return self.target_time(batch, gamma + 1, context), self.draft_time(batch, gamma)

    def step_overheads(self, batch: int, max_gamma: int) -> list[float]:
        """Measured seconds a step spends beyond its calibrated forwards at `batch` live rows, for
        γ = 0..max_gamma. Speculative steps (γ ≥ 1): the batch size's overhead learnt from them (the nearest
        measured one's; before any, plain steps' as the prior) plus each (batch, γ)'s own offset where one was
        measured. Plain steps: their own (`plain_overhead`), where measured; before that, the speculative steps'.

        The two are kept apart because at a real vocabulary they differ by more than an offset: a speculative
        step samples and verifies γ + 1 positions of the vocabulary and rolls back, which the calibrated forwards
        do not time (subword demo world, one live row: tens of ms). Pooled, plain decoding inherited that cost and
        auto-γ kept drafting at 0.79× plain (docs/benchmarks.md, the long-tail workload with trees)."""
        pooled = self._carried(self.overhead, batch)
        plain = self._carried(self.plain_overhead, batch)
        if pooled is None:
            pooled = plain if plain is not None else 0.0
        offsets = self.overhead_offsets.get(batch) or []
        out = [pooled + (offsets[g] if g < len(offsets) else 0.0) for g in range(max_gamma + 1)]
        if plain is not None:
            out[0] = plain
        return out

    def _carried(self, table: dict[int, float], batch: int) -> float | None:
        """`table`'s overhead at `batch`, else the nearest measured batch size's (None where none was). A positive one
        (sampling, bookkeeping: time the calibrated forwards leave out) carries over in seconds; a negative one is
        the calibration overstating the forwards, so it carries as that share of the forward, scaled by the two
        sizes' calibrated plain forwards. Carried in seconds, −0.15 s learnt at 32 rows on the subword demo made a
        12-row plain step take negative time and the break-even acceptance there 0.0."""
        if batch in table:
            return table[batch]
        if not table:
            return None
        near = min(table, key=lambda b: abs(b - batch))
        if table[near] >= 0:
            return table[near]
        return table[near] * self.target_time(batch, 1) / self.target_time(near, 1)

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
        if gamma == 0:  # a plain step: its own overhead (`step_overheads`)
            old = self.plain_overhead.get(batch)
            self.plain_overhead[batch] = extra if old is None else self.ema * old + (1 - self.ema) * min(
                max(extra, -verify / 2), 2 * max(old, 0.0) + verify / 10)
            return
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
    top = max(max_query or 0, max_gamma + 1)
    if top == max_gamma + 1:
        return chain
    key = _cache_key(target, drafter, max_batch, max_gamma) + f"-wide{top}"
    path = Path(cache_dir or _default_cache_dir()) / f"{key}.json"
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
    return CostModel(target=merged, drafter=chain.drafter, target_long=chain.target_long, contexts=chain.contexts)


def _calibrate_chains(target: ModelRunner, drafter: Drafter, max_batch: int, max_gamma: int, budget_s: float,
                      cache_dir: str | None) -> CostModel:
    top = max_gamma + 1
    key = _cache_key(target, drafter, max_batch, max_gamma)
    path = Path(cache_dir or _default_cache_dir()) / f"{key}.json"
    if path.exists():
        return _load(path)
    batch_sizes = _grid(max_batch)
    query_lens = _query_grid(top - 1)
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


def _cache_key(target: ModelRunner, drafter: Drafter, max_batch: int, max_gamma: int) -> str:
    device = target.device
    hw = f"{device}|{torch.get_num_threads()}|{torch.__version__}"
    if device.type == "cuda":
        hw += torch.cuda.get_device_name(device)
    raw = "|".join(["v5", model_cost_key(target), drafter.cost_key(), str(max_batch), str(max_gamma), hw])
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


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
