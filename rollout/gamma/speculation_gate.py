"""SpeculationGate: the acceptance a `speculation="when_learned"` engine decides on — the served drafter version's
held-out number, corrected by what the rollouts accepted once it drafted.

The learner scores a drafter without drafting (`online_drafter.served_acceptance`), on held-out positions of
earlier policy versions and at the head's first draft depths; the engine's chains draft deeper, on the current
policy. Measured in the cold-start main job (`docs/get_a_drafter.md`): versions whose held-out number passed
break-even (0.56, 0.78) accepted 0.38 and 0.56 per draft once they drafted. So the number is a claim the rollouts
check. Once a version has drafted, the engine decides on its accepted share per draft (the quantity break-even is
stated in) with the held-out number as a prior worth `prior_drafts` drafts: (accepted + k · claimed) / (drafted + k).
A later version's held-out number is lowered by the last drafting version's shortfall (claimed − that estimate,
when positive) until it drafts itself. A version that drafts below break-even is thus turned off after the
generate call that showed it — auto-γ itself stops drafting within a few steps of a drafter that keeps nothing,
so a fixed count of drafts would often never be reached — and the next version must beat break-even by the
proxy's known optimism.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIOR_DRAFTS = 32  # the held-out number's weight, in drafts: 32 drafts that keep nothing halve a claim of 1.0


@dataclass
class SpeculationGate:
    prior_drafts: int = PRIOR_DRAFTS
    version: int | None = None  # the version whose drafts are counted
    claimed: float | None = None  # its held-out number, as served
    drafted: int = 0
    accepted: int = 0
    gap: float = 0.0  # the last drafting version's claimed − estimated acceptance (0 if it kept as claimed or more)

    def acceptance(self, version: int, claimed: float | None) -> float | None:
        """What version `version` (held-out number `claimed`; None: unscored) is expected to keep per draft."""
        if version == self.version and self.drafted:
            return self._estimate()
        return None if claimed is None else claimed - self.gap

    def observe(self, version: int, claimed: float | None, drafted: int, accepted: int) -> None:
        """A generate call of version `version` (held-out number `claimed`) drafted `drafted` tokens and kept
        `accepted` of them."""
        if version != self.version:
            self.version, self.claimed, self.drafted, self.accepted = version, claimed, 0, 0
        self.drafted += drafted
        self.accepted += accepted
        if self.drafted and self.claimed is not None:
            self.gap = max(0.0, self.claimed - self._estimate())

    def _estimate(self) -> float:
        if self.claimed is None:
            return self.accepted / self.drafted
        return (self.accepted + self.prior_drafts * self.claimed) / (self.drafted + self.prior_drafts)
