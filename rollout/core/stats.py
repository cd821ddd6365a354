"""EngineStats: counters of one engine, accumulated across `generate` calls (reset with `reset`);
BatchStats: what one call (or several engines' calls together) did, `EngineStats.since(before)`.

Totals are plain numbers; the per-step traces (`gamma_per_step`, `live_rows_per_step`) keep only the
last `trace_steps` steps, so a long-lived worker's stats stay bounded. Anything that spans more steps
than the trace (per-call means, `mean_accepted_len`) is computed from the totals. The rates are
defined once, in `StatRates`, for both (docs/metrics.md is their table). `by_drafter` splits the
speculative work by drafter kind ("model", "suffix"): with several drafters each row of a step is
served by one of them (`drafters.suffix_or_model`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields

TRACE_STEPS = 4096
COUNTERS = ("target_forwards", "drafter_forwards", "generated_tokens", "drafted", "accepted", "tried", "steps",
            "wall_time_s", "gamma_sum", "row_steps", "spec_row_steps", "drafter_nonfinite_rows", "tree_steps",
            "tree_row_steps", "tree_nodes", "tree_accepted")


@dataclass
class StepSummary:
    """What one engine step did, as host numbers (the engine's one device→host copy of the step)."""

    finished: list[int]  # slots whose row ended this step
    emitted: int  # tokens appended, all rows
    stopped: int  # rows that emitted a stop token
    dropped_rows: int  # rows whose drafts were dropped (non-finite q)
    kept_per_position: list[int]  # [γ] rows whose draft i was kept
    drafted_per_position: list[int]  # [γ] rows that proposed a draft i
    by_drafter: dict[str, list[int]]  # kind → [rows it proposed for, drafts proposed, drafts kept]
    counts: list[list[int]] | None = None  # `append.acceptance_counts`, for an adaptive γ policy
    tried: int = 0  # drafts verified up to and including each row's first rejection (`StatRates.position_acceptance`)


@dataclass(frozen=True)
class DrafterStats:
    """One drafter kind's share: `proposals` row-steps it drafted for, `drafted` drafts, `accepted` kept."""

    proposals: int = 0
    drafted: int = 0
    accepted: int = 0

    def __add__(self, other: DrafterStats) -> DrafterStats:
        return DrafterStats(self.proposals + other.proposals, self.drafted + other.drafted,
                            self.accepted + other.accepted)

    def __sub__(self, other: DrafterStats) -> DrafterStats:
        return DrafterStats(self.proposals - other.proposals, self.drafted - other.drafted,
                            self.accepted - other.accepted)

    @property
    def acceptance_rate(self) -> float:
        """Its kept drafts / its drafts."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """Tokens per row-step it served: its kept drafts + the target's token (as `StatRates`')."""
        return 1.0 + self.accepted / self.proposals if self.proposals else 1.0

    def to_dict(self) -> dict:
        return {"proposals": self.proposals, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": self.acceptance_rate, "mean_accepted_len": self.mean_accepted_len}


def _merge(a: dict[str, DrafterStats], b: dict[str, DrafterStats], sign: int) -> dict[str, DrafterStats]:
    out = dict(a)
    for name, share in b.items():
        base = out.get(name, DrafterStats())
        out[name] = base + share if sign > 0 else base - share
    return out


class StatRates:
    """The derived numbers of a set of counters (`EngineStats` or `BatchStats`): one definition each."""

    generated_tokens: int
    drafted: int
    accepted: int
    tried: int
    steps: int
    wall_time_s: float
    gamma_sum: int
    row_steps: int
    spec_row_steps: int
    tree_row_steps: int
    tree_nodes: int
    tree_accepted: int

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def position_acceptance(self) -> float:
        """Accepted drafts / drafts tried: the per-position acceptance α of the cost model (a draft is tried when
        every draft before it in its row's chain was kept), its maximum-likelihood estimate under independent
        acceptance. `acceptance_rate` counts the drafts past a row's first rejection too, so over chains of γ
        it reads (α + … + α^γ) / γ — 0.24 where α = 0.6 and γ = 6 — not α, which break-even is stated in."""
        return self.accepted / self.tried if self.tried else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_time_s if self.wall_time_s else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """Tokens emitted per row per speculative step (accepted drafts + the one target token)."""
        return 1.0 + self.accepted / self.spec_row_steps if self.spec_row_steps else 1.0

    @property
    def mean_gamma(self) -> float:
        """γ per engine step, plain (γ = 0) steps included, every step weighing the same."""
        return self.gamma_sum / self.steps if self.steps else 0.0

    @property
    def mean_live_rows(self) -> float:
        return self.row_steps / self.steps if self.steps else 0.0

    @property
    def tree_nodes_per_row(self) -> float:
        """Draft nodes the target verified per row per tree step (a chain step of γ: γ; 0 without tree steps)."""
        return self.tree_nodes / self.tree_row_steps if self.tree_row_steps else 0.0

    @property
    def tree_accepted_len(self) -> float:
        """Tokens emitted per row per tree step — per target call (kept path + the target's token; 1 without)."""
        return 1.0 + self.tree_accepted / self.tree_row_steps if self.tree_row_steps else 1.0


@dataclass(frozen=True)
class BatchStats(StatRates):
    """The counters of one or more `generate` calls; `+` sums two (e.g. two workers' batches)."""

    target_forwards: int = 0
    drafter_forwards: int = 0
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    tried: int = 0
    steps: int = 0
    wall_time_s: float = 0.0
    gamma_sum: int = 0
    row_steps: int = 0
    spec_row_steps: int = 0
    drafter_nonfinite_rows: int = 0
    tree_steps: int = 0
    tree_row_steps: int = 0
    tree_nodes: int = 0
    tree_accepted: int = 0
    by_drafter: dict[str, DrafterStats] = field(default_factory=dict)

    def __add__(self, other: BatchStats) -> BatchStats:
        return BatchStats(**{name: getattr(self, name) + getattr(other, name) for name in COUNTERS},
                          by_drafter=_merge(self.by_drafter, other.by_drafter, +1))


@dataclass
class EngineStats(StatRates):
    target_forwards: int = 0
    drafter_forwards: int = 0
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    tried: int = 0  # drafts verified up to and including each row's first rejection
    steps: int = 0
    wall_time_s: float = 0.0
    gamma_sum: int = 0  # γ summed over steps
    row_steps: int = 0  # live rows summed over steps
    spec_row_steps: int = 0  # live rows summed over speculative (γ > 0) steps
    drafter_nonfinite_rows: int = 0  # row-steps whose drafts were dropped: the drafter's q was non-finite
    tree_steps: int = 0  # steps that verified a tree (`step.tree`)
    tree_row_steps: int = 0  # live rows summed over tree steps
    tree_nodes: int = 0  # draft nodes fed to the target in tree steps (rows × width × depth)
    tree_accepted: int = 0  # drafts kept in tree steps
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    trace_steps: int = TRACE_STEPS  # how many of the latest steps the two traces below keep
    gamma_per_step: deque[int] = field(default_factory=deque)
    live_rows_per_step: deque[int] = field(default_factory=deque)
    context_per_step: deque[int] = field(default_factory=deque)  # the longest row after the step
    tokens_per_step: deque[int] = field(default_factory=deque)  # tokens the step emitted, all rows
    by_drafter: dict[str, DrafterStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.trace_steps, int) or self.trace_steps < 1:
            raise ValueError(f"trace_steps={self.trace_steps!r} is invalid: an int >= 1")
        self.gamma_per_step = deque(self.gamma_per_step, maxlen=self.trace_steps)
        self.live_rows_per_step = deque(self.live_rows_per_step, maxlen=self.trace_steps)
        self.context_per_step = deque(self.context_per_step, maxlen=self.trace_steps)
        self.tokens_per_step = deque(self.tokens_per_step, maxlen=self.trace_steps)

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def since(self, before: BatchStats) -> BatchStats:
        """What happened since `before` (`self.totals()` taken earlier): one call's stats."""
        return BatchStats(**{name: getattr(self, name) - getattr(before, name) for name in COUNTERS},
                          by_drafter=_merge(self.by_drafter, before.by_drafter, -1))

    def totals(self) -> BatchStats:
        """The counters so far, as a `BatchStats` (the `before` of `since`)."""
        return BatchStats(**{name: getattr(self, name) for name in COUNTERS}, by_drafter=dict(self.by_drafter))

    def record_step(self, gamma: int, live_rows: int, step: StepSummary, context: int = 0, tree_nodes: int = 0
                    ) -> None:
        """Count one engine step of `live_rows` rows with up to γ drafts each (`step` says what it did); a tree
        step of depth γ also says how many draft nodes it verified (`tree_nodes`)."""
        if tree_nodes:
            self.tree_steps += 1
            self.tree_row_steps += live_rows
            self.tree_nodes += tree_nodes
            self.tree_accepted += sum(step.kept_per_position)
        self.steps += 1
        self.generated_tokens += step.emitted
        self.drafted += sum(step.drafted_per_position)
        self.accepted += sum(step.kept_per_position)
        self.tried += step.tried
        self.gamma_sum += gamma
        self.row_steps += live_rows
        self.spec_row_steps += live_rows if gamma else 0
        self.drafter_nonfinite_rows += step.dropped_rows
        width = max(gamma, len(self.drafted_per_position))
        for counts, new in ((self.drafted_per_position, step.drafted_per_position),
                            (self.accepted_per_position, step.kept_per_position)):
            counts.extend([0] * (width - len(counts)))
            for i, v in enumerate(new):
                counts[i] += v
        for name, counts in step.by_drafter.items():
            self.by_drafter[name] = self.by_drafter.get(name, DrafterStats()) + DrafterStats(*counts)
        self.gamma_per_step.append(gamma)
        self.live_rows_per_step.append(live_rows)
        self.context_per_step.append(context)
        self.tokens_per_step.append(step.emitted)

    def reset(self) -> None:
        fresh = EngineStats(trace_steps=self.trace_steps)
        self.__dict__.update(fresh.__dict__)

    def to_dict(self) -> dict:
        """Every field (traces as lists) and the derived rates: plain data, safe to keep or serialise."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("drafted_per_position", "accepted_per_position", "gamma_per_step", "live_rows_per_step",
                     "context_per_step", "tokens_per_step"):
            out[name] = list(out[name])
        out["by_drafter"] = {name: share.to_dict() for name, share in self.by_drafter.items()}
        out.update(
            acceptance_rate=self.acceptance_rate,
            position_acceptance=self.position_acceptance,
            acceptance_per_position=self.acceptance_per_position,
            tokens_per_s=self.tokens_per_s,
            mean_accepted_len=self.mean_accepted_len,
            mean_gamma=self.mean_gamma,
            mean_live_rows=self.mean_live_rows,
            tree_nodes_per_row=self.tree_nodes_per_row,
            tree_accepted_len=self.tree_accepted_len,
        )
        return out
