"""`SpecEngine`'s speculation: what each step speculates (`plan`: the γ policy's γ, the tree shape's depth and
width), what the policies learn from each step run (`observe`), and whether a generate call drafts at all
(`EngineConfig.speculation`: the break-even acceptance from the γ policy's cost model, and the served drafter
version's held-out acceptance as the `gamma.speculation_gate` corrects it), and whether a chain step drafts its
successor beside verification (`EngineConfig.overlap`, `gamma.overlap_choice`). The engine holds one
(`SpecEngine.speculation`) and delegates its public `speculating` and `break_even_acceptance` to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import EngineConfig
from .core.batch import HostStep
from .core.stats import EngineStats, StepSummary
from .drafters.protocol import Drafter
from .engine_weights import EngineWeights
from .gamma.overlap_choice import OverlapChoice
from .gamma.policy import GammaPolicy, StepOutcome, StepShape
from .gamma.speculation_gate import SpeculationGate
from .gamma.tree_shape import AutoWidth, FixedWidth
from .models.timing import CALIBRATION_CONTEXT

STATE_PARTS = ("gamma_kind", "gamma", "tree")  # `EngineSpeculation.state_dict`'s


@dataclass
class StepPlan:
    """What one step of `shape.rows` live rows speculates (`EngineSpeculation.plan`)."""

    shape: StepShape
    depth: int  # γ: drafts per row of a chain, levels of a tree (0: a plain step)
    width: int = 1  # candidates per tree level (1: a chain)
    overlap: bool = False  # a chain step that drafts the next step while the target verifies (`placement.ahead`)


@dataclass
class StepReport:
    """One step as the policies learn from it (`EngineSpeculation.observe`): the plan, what it did, what it cost."""

    plan: StepPlan
    depth: int  # the γ verified (a chain may verify fewer columns than planned)
    summary: StepSummary  # `summary.finished`: the rows that ended
    kept: HostStep  # per row, what it kept (host lists)
    seconds: float
    draft_seconds: float | None  # the part of `seconds` spent drafting (None: not measured)


class EngineSpeculation:
    """The γ policy, the tree shape (None: chains only) and the speculation gate of one engine."""

    def __init__(self, config: EngineConfig, drafter: Drafter | None, stats: EngineStats, weights: EngineWeights,
                 gamma_policy: GammaPolicy, tree_policy: FixedWidth | AutoWidth | None):
        self.config, self.drafter, self.stats, self.weights = config, drafter, stats, weights
        self.gamma_policy, self.tree_policy = gamma_policy, tree_policy
        self.overlap = OverlapChoice(config.overlap)
        self.gate = SpeculationGate()  # "when_learned": the served acceptance, checked by what rollouts accept
        # Rows were prefilled, or steps run plain or as trees, since the last chain step drafted: the next drafting
        # step first catches the drafter up, a step auto-γ learns acceptance from but does not time.
        self.drafter_behind = False

    def plan(self, shape: StepShape, greedy: bool, drafting: bool) -> StepPlan:
        """The next step's γ (0 where this call does not draft) and tree shape."""
        gamma = self.gamma_policy.choose(shape, greedy) if drafting else 0
        if self.tree_policy is None:
            return StepPlan(shape, gamma, overlap=bool(gamma) and self.overlap.choose(shape.rows))
        depth, width = self.tree_policy.choose(shape, gamma, greedy)
        return StepPlan(shape, gamma) if width == 1 else StepPlan(shape, depth, width)

    def observe(self, report: StepReport, greedy: bool) -> None:
        """Show a step run to the policy that chose its shape: a tree to the tree shape, a chain to an adaptive γ
        policy."""
        plan, summary = report.plan, report.summary
        if plan.width > 1:
            self.tree_policy.observe(plan.shape, plan.depth, plan.width, report.kept.accepted_len,
                                     report.kept.drafted_len, report.seconds, greedy)
            # The tree's drafter forwards moved no drafter length: the next chain step catches it up on the kept path
            # (up to depth + 1 tokens, not a chain's 1-2), a step auto-γ must not time: timed, it made drafting look
            # dearer after every tree step (the draft scale is one number for every batch size).
            self.drafter_behind = True
            return
        gamma = report.depth
        if gamma:
            self.overlap.observe(plan.shape.rows, plan.overlap, summary.emitted, report.seconds)
        if self.gamma_policy.adaptive:
            # A step that drafted ahead teaches acceptance, not step time: the cost model stays one of serial steps.
            self.gamma_policy.observe(plan.shape, StepOutcome(
                gamma=gamma, rows=plan.shape.rows, counts=summary.counts, emitted=summary.emitted,
                stopped=summary.stopped, seconds=report.seconds, draft_seconds=report.draft_seconds,
                catch_up=bool(gamma) and (self.drafter_behind or plan.overlap),
            ), greedy)
        self.drafter_behind = not gamma

    def observe_call(self, tried: int, accepted: int) -> None:
        """A drafting generate call's drafts tried and kept, for the gate (with `speculation` "when_learned")."""
        if self.config.speculation == "when_learned":
            self.gate.observe(self.weights.drafter_version, self.served_acceptance(), tried, accepted)

    def break_even_acceptance(self) -> float | None:
        """Per-draft acceptance below which speculation stops paying at this engine's recent batch shape,
        from the γ policy's cost model (None for a fixed γ: there is no cost model to ask)."""
        if self.drafter is None:
            return None
        rows = max(1, round(self.stats.mean_live_rows)) if self.stats.steps else self.config.max_batch_size
        return self.gamma_policy.break_even_acceptance(rows, CALIBRATION_CONTEXT)

    def speculating(self, break_even_acceptance: Callable[[], float | None]) -> bool:
        """Whether a generate call starting now drafts, given the engine's break-even acceptance (asked only with
        "when_learned": `SpecEngine.break_even_acceptance`, this part's number unless a caller pinned the engine's).
        Always with `speculation` "always" (and a drafter); with "when_learned" once the served drafter version's
        acceptance reaches the break-even acceptance: its held-out number (under the invariant sampler a lower bound:
        at a position with Σ min(p, q) = 1 − TV the rule keeps a draft with probability ≥ (1 − TV) / (1 + TV); the
        learner publishes the mean of the positions' bounds), replaced by what its drafts kept per draft tried once it
        has drafted, and corrected by the last measured version's error until then (`gamma.speculation_gate`)."""
        if self.drafter is None or self.config.speculation == "always":
            return self.drafter is not None
        accept = self.gate.acceptance(self.weights.drafter_version, self.served_acceptance())
        break_even = break_even_acceptance()
        return accept is not None and break_even is not None and accept >= break_even

    def served_acceptance(self) -> float | None:
        """The served version's held-out acceptance for this engine's sampler."""
        invariant = self.config.sampler == "invariant"
        return self.weights.drafter_invariant_acceptance if invariant else self.weights.drafter_acceptance

    def state_dict(self) -> dict[str, Any]:
        """The γ policy's acceptance statistics, step counters and online time corrections (`GammaPolicy.state_dict`:
        restored together — acceptance without the measured per-step overhead makes speculation look dearer than it
        is, and a resumed engine then decodes plain) and, with `tree_width: auto`, the tree shape's
        (`gamma.tree_shape.AutoWidth.state_dict`; None for chains or a fixed width, which learn nothing)."""
        tree = self.tree_policy.state_dict() if isinstance(self.tree_policy, AutoWidth) else None
        return dict(zip(STATE_PARTS, (type(self.gamma_policy).__name__, self.gamma_policy.state_dict(), tree)))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back a `state_dict()`; `ValueError` naming both if the saved γ policy is not this one's."""
        kind = type(self.gamma_policy).__name__
        if state["gamma_kind"] != kind:
            raise ValueError(f"the saved engine's γ policy is {state['gamma_kind']}, this engine's {kind}: "
                             "engine.gamma must be the saved run's")
        self.gamma_policy.load_state_dict(state["gamma"])
        tree = state.get("tree")  # absent in a state saved before trees kept one
        if tree is not None and isinstance(self.tree_policy, AutoWidth):
            self.tree_policy.load_state_dict(tree)
