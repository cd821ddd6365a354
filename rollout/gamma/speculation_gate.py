"""SpeculationGate: the acceptance a `speculation="when_learned"` engine decides on — the served drafter version's
held-out number, corrected by what the rollouts accepted once it drafted.

The learner scores a drafter without drafting (`online_drafter.served_acceptance`), on held-out positions of
earlier policy versions and at the head's first draft depths; the engine's chains draft deeper, on the current
policy. So the number is a claim the rollouts check. Both are per-position acceptances α — the unit break-even is
stated in (`gamma.break_even`: a draft at depth i is kept with probability α given the ones before it were) — so
the rollouts' side is counted in drafts *tried* (`StatRates.position_acceptance`: a draft is tried when every
earlier draft of its row's chain was kept), not in drafts proposed: over chains of γ the kept share of the
proposed drafts is (α + … + α^γ) / γ, 0.24 for α = 0.6 at γ = 6, which compared with an α would turn off a head
that keeps as claimed. Once a version has drafted, the engine decides on its drafts kept per draft tried with the
held-out number as a prior worth `prior_drafts` tried drafts: (accepted + k · claimed) / (tried + k). A later
version's held-out number is corrected by the last drafting version's error (claimed − that estimate) until it
drafts itself: lowered by a shortfall, raised by a surplus (under `sampler: invariant` the number is a lower
bound, `scorer.invariant_bound`: in the subword world's cold start a version held out at 0.59 kept 0.63 of its
tried drafts, and the next, held out at 0.65, was switched off on its bound). A version that drafts below
break-even is thus turned off after the generate call that showed it — auto-γ itself stops drafting within a few
steps of a drafter that keeps nothing, so a fixed count of drafts would often never be reached — and the next
version must beat break-even by the proxy's last measured error.

Before 2026-12-06 the gate compared the kept share of proposed drafts with the claim and carried only shortfalls:
in the subword world's cold start a fresh EAGLE head's first drafting version (held out 0.48, chains of 6) kept
0.10 of its proposed drafts, and that shortfall — with auto-γ's break-even raised to 1.0 by the same call's
catch-up step (`AutoGamma.observe`) — kept every later version off, versions held out at 0.72–0.85 that the
closing measurement ran at 1.11× plain.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIOR_DRAFTS = 32  # the held-out number's weight, in tried drafts: 32 that keep nothing halve a claim of 1.0


@dataclass
class SpeculationGate:
    prior_drafts: int = PRIOR_DRAFTS
    version: int | None = None  # the version whose drafts are counted
    claimed: float | None = None  # its held-out number, as served
    tried: int = 0  # drafts tried by the counted version (kept + its rows' first rejections)
    accepted: int = 0
    gap: float = 0.0  # the last drafting version's claimed − estimated acceptance (< 0: it kept more than claimed)

    def acceptance(self, version: int, claimed: float | None) -> float | None:
        """What version `version` (held-out number `claimed`; None: unscored) is expected to keep per draft."""
        if version == self.version and self.tried:
            return self._estimate()
        return None if claimed is None else claimed - self.gap

    def observe(self, version: int, claimed: float | None, tried: int, accepted: int) -> None:
        """A generate call of version `version` (held-out number `claimed`) tried `tried` drafts (each draft
        whose row had kept every earlier draft of its chain) and kept `accepted` of them."""
        if version != self.version:
            self.version, self.claimed, self.tried, self.accepted = version, claimed, 0, 0
        self.tried += tried
        self.accepted += accepted
        if self.tried and self.claimed is not None:
            self.gap = self.claimed - self._estimate()

    def _estimate(self) -> float:
        if self.claimed is None:
            return self.accepted / self.tried
        return (self.accepted + self.prior_drafts * self.claimed) / (self.tried + self.prior_drafts)
