"""`SimpleGamma` (`EngineConfig.gamma = "auto_simple"`): the γ with the most expected tokens per second,
from the calibrated forward times and a running per-position acceptance — the simple alternative to
`auto.AutoGamma` (`"auto"`).

Before each step, for the live batch size n and the KV length the step reads:

    tokens(γ) = 1 + Σ_{k=1..γ} Π_{j≤k} α_j                 expected tokens per row
    time(γ)   = verify(n, γ + 1, context) + s · draft(n, γ) + o(n)
    γ         = argmax_γ tokens(γ) / time(γ)                0 when no γ beats plain decoding

`verify` and `draft` are the calibrated forward times (`calibration.calibrate`). Two corrections are
learnt from the steps run, because a step is not its calibrated forwards (demo models on this
project's CPU: each draft ~2× its calibrated forward, the drafter's weights falling out of the caches
while the target runs; +4–16 ms a step at 1–16 rows for sampling, verification and bookkeeping,
hardly depending on γ): `s`, the measured ÷ calibrated drafting time, and `o(n)`, the seconds a step
at n rows spends beyond its forwards (the nearest measured batch size's where n was not run yet),
both as moving averages. One factor for the whole step would make each query token look dearer than
it is. α_j = P(draft j kept | drafts < j kept) comes from exponentially decayed counts (per greedy /
sampled: `core.rates.DecayedRates`), shrunk toward the pooled rate of all positions so that one rejection
at a deep position cannot rule it out (the prior and both weights are `estimate`'s). The first step drafts
`max_gamma` (it measures every position); acceptance is only measured while drafting, so after
`PROBE_EVERY` plain steps one step runs the best γ ≥ 1.

Left out, against `AutoGamma`: each row's remaining length budget, stop tokens, the lower acceptance
of steps that start right after a rejection (the two start states' counts are pooled here), per-γ
overhead offsets and rules for sticking to and trying γ. In paired runs it drafted longer than
`AutoGamma` at 16 rows and more (its one overhead per batch size makes long drafts look cheap) and was
slower there, by an interval excluding 1 at sampled b = 16 (docs/benchmarks.md), so "auto" stays
`AutoGamma`.
"""

from __future__ import annotations

from ..core.rates import PRIOR_ACCEPTANCE, DecayedRates
from .break_even import break_even_acceptance
from .cost_model import CostModel
from .estimate import PRIOR_ROWS, SHRINK_ROWS
from .policy import StepOutcome, StepShape

COST_EMA = 0.8  # weight of the old value in the time corrections (memory ~5 steps)
PROBE_EVERY = 32  # plain steps between probes of the best γ ≥ 1


class SimpleGamma:
    """The `GammaPolicy` of `EngineConfig.gamma = "auto_simple"` (see the module docstring); `decay` is
    `EngineConfig.acceptance_ema`, the per-step decay of the acceptance counts."""

    adaptive = True

    def __init__(self, cost: CostModel, max_gamma: int, decay: float):
        self.cost, self.max_gamma, self.decay = cost, max_gamma, decay
        self.acceptance = {True: DecayedRates(max_gamma), False: DecayedRates(max_gamma)}  # per mode (greedy?)
        self.draft_scale = 1.0
        self.overhead: dict[int, float] = {}  # live rows → o(n)
        self.plain_steps = 0

    def state_dict(self) -> dict:
        """The acceptance counts per mode, the time corrections and the plain-step counter, for a resumed run
        (`SpecEngine.state_dict`)."""
        return {"acceptance": {mode: rates.state_dict() for mode, rates in self.acceptance.items()},
                "draft_scale": self.draft_scale, "overhead": dict(self.overhead), "plain_steps": self.plain_steps}

    def load_state_dict(self, state: dict) -> None:
        for mode, rates in self.acceptance.items():
            rates.load_state_dict(state["acceptance"][mode])
        self.draft_scale = float(state["draft_scale"])
        self.overhead = {int(rows): float(extra) for rows, extra in state["overhead"].items()}
        self.plain_steps = int(state["plain_steps"])

    def alpha(self, greedy: bool) -> list[float]:
        acceptance = self.acceptance[greedy]
        return acceptance.shrunk(acceptance.pooled(PRIOR_ACCEPTANCE, PRIOR_ROWS), SHRINK_ROWS)

    def expected_tokens(self, greedy: bool) -> list[float]:
        """tokens(γ) per row for γ = 0..max_gamma."""
        out, survive = [1.0], 1.0
        for a in self.alpha(greedy):
            survive *= a
            out.append(out[-1] + survive)
        return out

    def calibrated_times(self, rows: int, context: int) -> tuple[list[float], list[float]]:
        """Calibrated (verify, draft) seconds for γ = 0..max_gamma; the grid lookups are kept per batch
        size (the policy asks every step, and a slow policy eats a small model's gain)."""
        short, added, draft = self.cost.gamma_parts(rows, self.max_gamma)
        w = self.cost.context_weight(context)
        return [s + w * a for s, a in zip(short, added)], draft

    def _overhead(self, rows: int) -> float:
        if rows in self.overhead or not self.overhead:
            return self.overhead.get(rows, 0.0)
        return self.overhead[min(self.overhead, key=lambda n: abs(n - rows))]

    def step_times(self, rows: int, context: int) -> list[float]:
        """Predicted step seconds for γ = 0..max_gamma."""
        verify, draft = self.calibrated_times(rows, context)
        extra = self._overhead(rows)
        return [max(v + extra + self.draft_scale * d, 1e-7) for v, d in zip(verify, draft)]

    def rates(self, shape: StepShape, greedy: bool) -> list[float]:
        """Expected tokens per second per row for γ = 0..max_gamma."""
        return [t / s for t, s in zip(self.expected_tokens(greedy), self.step_times(shape.rows, shape.context))]

    def choose(self, shape: StepShape, greedy: bool) -> int:
        self.cost.greedy = greedy  # the verified positions' sampling is priced in this mode
        if not any(self.acceptance[greedy].reached):
            return self.max_gamma  # one step at max_gamma measures every position
        rates = self.rates(shape, greedy)
        best = max(range(len(rates)), key=rates.__getitem__)
        if best:
            return best
        self.plain_steps += 1
        if self.plain_steps % PROBE_EVERY:
            return 0
        return max(range(1, len(rates)), key=rates.__getitem__)

    def narrow(self, shape: StepShape, expected_kept: list[float]) -> int:
        """The drafts are made: the width whose verification pays best for the drafts expected kept."""
        verify, _ = self.calibrated_times(shape.rows, shape.context)
        rates = [(shape.rows + kept) / verify[min(w, self.max_gamma)] for w, kept in enumerate(expected_kept)]
        return max(range(len(rates)), key=rates.__getitem__)

    def observe(self, shape: StepShape, outcome: StepOutcome, greedy: bool) -> None:
        self.cost.greedy = greedy
        if outcome.counts:  # [reached, kept] per start state (`core.append.acceptance_counts`), pooled here
            reached = [a + b for a, b in zip(outcome.counts[0], outcome.counts[2])]
            kept = [a + b for a, b in zip(outcome.counts[1], outcome.counts[3])]
            acceptance = self.acceptance[greedy]
            acceptance.decay(self.decay)
            for j in range(min(len(acceptance), len(kept), len(reached))):
                acceptance.add(j, kept[j], reached[j])
        if outcome.catch_up:  # no steady step's time (`StepOutcome.catch_up`)
            return
        verify, draft = self.calibrated_times(shape.rows, shape.context)
        gamma, drafting = outcome.gamma, outcome.draft_seconds or 0.0
        # One stalled step (GC, another process) moves a correction by at most 2× or one forward's worth;
        # the draft scale is only measured while drafting, so a stall must not talk it out of drafting.
        if gamma and draft[gamma] > 0:
            ratio = min(max(drafting / draft[gamma], self.draft_scale / 2), 2 * self.draft_scale)
            self.draft_scale = COST_EMA * self.draft_scale + (1 - COST_EMA) * ratio
        extra = outcome.seconds - drafting - verify[gamma]
        if not self.overhead:
            self.overhead[shape.rows] = extra
            return
        old = self._overhead(shape.rows)  # a batch size not run yet starts from the nearest one's
        extra = min(extra, max(old, 0.0) + verify[gamma])
        self.overhead[shape.rows] = COST_EMA * old + (1 - COST_EMA) * extra

    def break_even_acceptance(self, rows: int, context: int) -> float:
        return break_even_acceptance(self.step_times(rows, context))
