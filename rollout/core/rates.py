"""DecayedRates: exponentially decayed kept / reached counts per slot, and the acceptance rates they give.

Every running acceptance in the engine is this one estimator: per slot (a draft position, or a suffix
match-length bucket) the drafts that were reached and those kept, the old counts decayed by a factor before
each step's are added, read as a rate pulled toward a prior worth `weight` pseudo-drafts:

    rate_j = (kept_j + weight · prior) / (reached_j + weight)

Its users: the γ policies' acceptance per draft position (`gamma.estimate.AcceptanceEstimate`, per start
state; `gamma.simple.SimpleGamma`), the model drafter's in the per-row choice (`drafters.suffix_or_model`)
and the suffix drafter's per match length (`drafters.suffix`). Each keeps its own decay, prior and weight.
"""

from __future__ import annotations

PRIOR_ACCEPTANCE = 0.6  # a model drafter's per-draft acceptance before any is measured


class DecayedRates:
    """`kept[j]`, `reached[j]`: the decayed counts of slot j (lists, read by the users' own arithmetic)."""

    def __init__(self, size: int = 0):
        self.kept = [0.0] * size
        self.reached = [0.0] * size

    def __len__(self) -> int:
        return len(self.kept)

    def grow(self, size: int) -> None:
        """At least `size` slots; new ones start with no evidence."""
        if len(self.kept) < size:
            self.kept += [0.0] * (size - len(self.kept))
            self.reached += [0.0] * (size - len(self.reached))

    def decay(self, factor: float) -> None:
        """Forget: every count times `factor` (done once per step, before the step's counts are added)."""
        self.kept = [factor * k for k in self.kept]
        self.reached = [factor * r for r in self.reached]

    def add(self, slot: int, kept: float, reached: float) -> None:
        self.kept[slot] += kept
        self.reached[slot] += reached

    def rate(self, slot: int, prior: float, weight: float) -> float:
        """Slot `slot`'s rate, pulled toward `prior` by `weight` pseudo-drafts (a slot past the end: the prior's)."""
        kept, reached = (self.kept[slot], self.reached[slot]) if slot < len(self.kept) else (0.0, 0.0)
        return (kept + weight * prior) / (reached + weight)

    def pooled(self, prior: float, weight: float) -> float:
        """The rate of all slots together, pulled toward `prior` by `weight` pseudo-drafts."""
        return (sum(self.kept) + prior * weight) / (sum(self.reached) + weight)

    def shrunk(self, toward: float | list[float], weight: float) -> list[float]:
        """Every slot's rate, pulled toward `toward` (one rate, or one per slot) by `weight` pseudo-drafts."""
        targets = toward if isinstance(toward, list) else [toward] * len(self.kept)
        return [(k + weight * a) / (r + weight) for k, r, a in zip(self.kept, self.reached, targets)]

    def state_dict(self) -> dict[str, list[float]]:
        """The counts, for a resumed run (`SpecEngine.state_dict`)."""
        return {"kept": list(self.kept), "reached": list(self.reached)}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        self.kept = [float(k) for k in state["kept"]]
        self.reached = [float(r) for r in state["reached"]]

    def __add__(self, other: DecayedRates) -> DecayedRates:
        """Both counts summed slot by slot (e.g. two start states pooled)."""
        out = DecayedRates()
        out.kept = [a + b for a, b in zip(self.kept, other.kept)]
        out.reached = [a + b for a, b in zip(self.reached, other.reached)]
        return out
