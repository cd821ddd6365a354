"""`AutoGamma` (`EngineConfig.gamma = "auto"`): the γ with the most expected tokens per second for the live batch.

Before each step (`policy.GammaPolicy.choose`, given the live batch's `policy.StepShape`) it picks
γ ∈ {0, …, max_gamma} maximising the batch's expected tokens over the step's time, where

    E[tokens of a row | γ] = Σ_{k=0..min(γ, room)} S_k,   S_k = Π_{j≤k} α_j (1 - h)
    time(γ, n)            = γ drafts (forward + sampling) + one target forward of γ + 1 tokens, n rows

α_j = P(draft j kept | drafts < j kept), kept online per draft position (exponentially weighted,
separately for greedy and sampled runs, and per start state: see `estimate.AcceptanceEstimate`); h = the
share of emitted tokens that are stop tokens, after which a row's remaining drafts are wasted; room = the
drafts a row's length budget can still use. Time comes from a `CostModel` measured on this hardware
and corrected online from the steps run (drafts and the rest of the step separately, per batch size
and γ). Near the top the predicted rates differ by less than their error, so the policy keeps its last
γ unless another is predicted `STICK_WITHIN` better, and every `TRY_EVERY` steps runs a γ predicted
within `TRY_WITHIN` of the best, so that γ's own step time gets measured (and plain decoding every
`PLAIN_CHECK_EVERY` speculative steps: its overhead is learnt apart from theirs). γ = 0 (plain decoding)
wins whenever the drafter's cost or a low acceptance does not pay — as it does for large live
batches, where a forward of γ + 1 tokens per row is no longer nearly free. There is no hard-coded
batch threshold. `"auto_simple"` selects `simple.SimpleGamma`, which leaves most of this out.

The acceptance model it chooses with is `estimate.AcceptanceEstimate`. The simpler `SimpleGamma`
(~100 lines) was slower by a paired interval excluding 1 at sampled b = 16 in the comparison that
kept this policy as "auto" (docs/benchmarks.md).
"""

from __future__ import annotations

from .break_even import break_even_acceptance
from .cost_model import CostModel
from .estimate import AcceptanceEstimate
from .policy import StepOutcome, StepShape

STICK_WITHIN = 0.03  # keep the last γ while it is predicted within this fraction of the best
TRY_EVERY = 16  # steps between runs of a γ predicted close to the best, to measure its time
TRY_WITHIN = 0.05  # ... close: within this fraction of the best
EXPLORE_EVERY = 32  # plain steps between probes of the best γ > 0, so stale α estimates can recover
EXPLORE_WITHIN = 0.75  # ... probed only if predicted to reach this fraction of plain throughput
PLAIN_CHECK_EVERY = 64  # speculative steps at one live batch size between plain steps run to time plain decoding
PLAIN_CHECK_FIRST = 8  # ... before the first one there (a rollout phase's full batch lasts few steps)


class AutoGamma:
    """The `GammaPolicy` of `EngineConfig.gamma = "auto"` (see the module docstring); `decay` is
    `EngineConfig.acceptance_ema`, the per-step decay of the acceptance counts."""

    adaptive = True

    def __init__(self, cost: CostModel, max_gamma: int, decay: float):
        self.cost = cost
        self.max_gamma = max_gamma
        self.estimates = {True: AcceptanceEstimate(max_gamma, decay), False: AcceptanceEstimate(max_gamma, decay)}
        self.plain_steps = 0
        self.last: dict[bool, int] = {}  # the γ chosen last, per mode
        self.steps = 0
        self.tried: dict[tuple[int, int], int] = {}  # (live rows, γ) → the step it was last run at
        self.since_plain: dict[int, int] = {}  # live rows → speculative steps there since the last plain one
        self._raw: tuple[int, int, bool, tuple[list[float], list[float]]] | None = None

    def state_dict(self) -> dict:
        """What it learnt from the steps run — acceptance per mode, the cost model's online corrections (not its
        calibration) — and its step counters, for a resumed run (`SpecEngine.state_dict`)."""
        return {"estimates": {mode: estimate.state_dict() for mode, estimate in self.estimates.items()},
                "cost": self.cost.corrections_state(),
                "plain_steps": self.plain_steps, "last": dict(self.last), "steps": self.steps,
                "tried": dict(self.tried), "since_plain": dict(self.since_plain)}

    def load_state_dict(self, state: dict) -> None:
        for mode, estimate in self.estimates.items():
            estimate.load_state_dict(state["estimates"][mode])
        self.cost.load_corrections_state(state["cost"])
        self.plain_steps, self.steps = int(state["plain_steps"]), int(state["steps"])
        self.last = {bool(mode): int(g) for mode, g in state["last"].items()}
        self.tried = {(int(rows), int(g)): int(step) for (rows, g), step in state["tried"].items()}
        self.since_plain = {int(rows): int(n) for rows, n in state.get("since_plain", {}).items()}

    def _raw_step_times(self, rows: int, context: int) -> tuple[list[float], list[float]]:
        """Calibrated (verify, draft) seconds for every γ. The grid lookups are cached per live batch
        size and the context enters linearly, so a step costs a few list operations — a policy that
        costs a millisecond per step would eat the gain of small models."""
        if self._raw is not None and self._raw[:3] == (rows, context, self.cost.greedy):
            return self._raw[3]
        short, added, draft = self.cost.gamma_parts(rows, self.max_gamma)
        w = self.cost.context_weight(context)
        raw = ([max(s + w * a, 1e-7) for s, a in zip(short, added)], draft)
        self._raw = (rows, context, self.cost.greedy, raw)
        return raw

    def step_times(self, rows: int, context: int) -> list[float]:
        """Predicted step seconds for every γ: calibrated forwards plus the online corrections."""
        return self.cost.corrected(rows, *self._raw_step_times(rows, context))

    def break_even_acceptance(self, rows: int, context: int) -> float:
        """The per-draft acceptance below which no γ ≥ 1 beats plain decoding at this batch shape."""
        return break_even_acceptance(self.step_times(rows, context))

    def rates(self, shape: StepShape, greedy: bool) -> list[float]:
        """Expected tokens per second of the step for every γ = 0..max_gamma."""
        tokens = self.estimates[greedy].batch_tokens(shape.rows, shape.room)
        return [t / s for t, s in zip(tokens, self.step_times(shape.rows, shape.context))]

    def narrow(self, shape: StepShape, expected_kept: list[float]) -> int:
        """The drafts are made (their cost is spent): weigh each width's expected tokens against the
        predicted time of verifying it."""
        verify, _ = self._raw_step_times(shape.rows, shape.context)
        times = self.cost.corrected(shape.rows, verify, [0.0] * len(verify))
        rates = [(shape.rows + kept) / times[min(w, len(times) - 1)] for w, kept in enumerate(expected_kept)]
        return max(range(len(rates)), key=rates.__getitem__)

    def choose(self, shape: StepShape, greedy: bool) -> int:
        self.cost.greedy = greedy  # a greedy step samples more cheaply (`CostModel.sampling_time`)
        if not self.estimates[greedy].any_seen:
            # Nothing measured yet for this mode: one step at max_gamma measures α at every position
            # (a prior alone could keep speculation off where it pays).
            return self.max_gamma
        rates = self.rates(shape, greedy)
        best = max(range(len(rates)), key=rates.__getitem__)
        last = self.last.get(greedy)
        if last is not None and rates[last] >= (1 - STICK_WITHIN) * rates[best]:
            best = last  # not worth a switch: near the top the ranking is mostly estimation noise
        self.last[greedy] = best
        self.steps += 1
        if self.steps % TRY_EVERY == 0:
            # The step-time model is calibrated forwards plus corrections learnt from the γ actually
            # run, and between γ close to the best it errs by a few percent (at 16 rows γ = 8 was
            # predicted faster than γ = 4 and ran 4 % slower). Now and then run the contender within
            # TRY_WITHIN of the best that was run longest ago, so its own time offset is measured.
            near = [g for g in range(len(rates)) if g != best and rates[g] >= (1 - TRY_WITHIN) * rates[best]]
            if near:
                pick = min(near, key=lambda g: self.tried.get((shape.rows, g), -1))
                self.tried[shape.rows, pick] = self.steps
                if pick:  # a speculative step too, for the plain check below
                    self.since_plain[shape.rows] = self.since_plain.get(shape.rows, 0) + 1
                return pick
        self.tried[shape.rows, best] = self.steps
        if best > 0:
            # Plain decoding's own step time is measured only by running it (`CostModel.step_overheads`): where
            # speculation runs on, one plain step after PLAIN_CHECK_FIRST speculative ones at a batch size, then
            # every PLAIN_CHECK_EVERY, keeps it measured, at a cost of at most that share of a step's gain.
            due = self.since_plain.get(shape.rows, 0) + 1
            limit = PLAIN_CHECK_EVERY if (shape.rows, 0) in self.tried else PLAIN_CHECK_FIRST
            self.since_plain[shape.rows] = 0 if due >= limit else due
            if due >= limit:
                self.tried[shape.rows, 0] = self.steps
                return 0
            return best
        self.since_plain[shape.rows] = 0
        # Acceptance is only measured while speculating: an estimate that talked us into plain
        # decoding would never be corrected. Probe the runner-up now and then, at bounded cost.
        self.plain_steps += 1
        runner_up = max(range(1, len(rates)), key=rates.__getitem__)
        if self.plain_steps % EXPLORE_EVERY == 0 and rates[runner_up] >= EXPLORE_WITHIN * rates[0]:
            return runner_up
        return 0

    def observe(self, shape: StepShape, outcome: StepOutcome, greedy: bool) -> None:
        self.cost.greedy = greedy
        self.estimates[greedy].update_counts(outcome.counts, outcome.rows, outcome.emitted, outcome.stopped)
        if outcome.catch_up:
            # The first drafting step after a prefill catches the drafter up on every prompt (measured in the
            # subword world: 2.6-3.5x the calibrated draft time at 32 rows): folded in, it made drafting look dear
            # everywhere (the draft scale is one number), and a `when_learned` engine then never drafted again.
            return
        verify, draft = self._raw_step_times(shape.rows, shape.context)
        self.cost.observe(shape.rows, outcome.gamma, outcome.seconds, shape.context, outcome.draft_seconds,
                          (verify[outcome.gamma], draft[outcome.gamma]))
