"""`SpecEngine`'s decision whether a generate call drafts at all (`EngineConfig.speculation`): the break-even
acceptance from the γ policy's cost model, and the served drafter version's held-out acceptance as the
`gamma.speculation_gate` corrects it. A base of `engine.SpecEngine`, which sets the attributes annotated below.
"""

from __future__ import annotations

from .config import EngineConfig
from .core.stats import EngineStats
from .drafters.protocol import Drafter
from .gamma.policy import GammaPolicy
from .gamma.speculation_gate import SpeculationGate
from .models.timing import CALIBRATION_CONTEXT


class EngineSpeculation:
    config: EngineConfig
    drafter: Drafter | None
    stats: EngineStats
    gamma_policy: GammaPolicy
    speculation_gate: SpeculationGate
    drafter_version: int
    drafter_acceptance: float | None
    drafter_invariant_acceptance: float | None

    def break_even_acceptance(self) -> float | None:
        """Per-draft acceptance below which speculation stops paying at this engine's recent batch shape,
        from the γ policy's cost model (None for a fixed γ: there is no cost model to ask)."""
        if self.drafter is None:
            return None
        rows = max(1, round(self.stats.mean_live_rows)) if self.stats.steps else self.config.max_batch_size
        return self.gamma_policy.break_even_acceptance(rows, CALIBRATION_CONTEXT)

    @property
    def speculating(self) -> bool:
        """Whether a generate call starting now drafts: always with `speculation` "always" (and a drafter); with
        "when_learned" once the served drafter version's acceptance reaches the break-even acceptance: its held-out
        number (under the invariant sampler a lower bound: at a position with Σ min(p, q) = 1 − TV the rule keeps a
        draft with probability ≥ (1 − TV) / (1 + TV); the learner publishes the mean of the positions' bounds),
        replaced by what its drafts kept per draft tried once it has drafted, and corrected by the last measured
        version's error until then (`gamma.speculation_gate`)."""
        if self.drafter is None or self.config.speculation == "always":
            return self.drafter is not None
        accept = self.speculation_gate.acceptance(self.drafter_version, self._served_acceptance())
        break_even = self.break_even_acceptance()
        return accept is not None and break_even is not None and accept >= break_even

    def _served_acceptance(self) -> float | None:
        """The served version's held-out acceptance for this engine's sampler."""
        return self.drafter_invariant_acceptance if self.config.sampler == "invariant" else self.drafter_acceptance
