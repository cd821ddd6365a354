"""AcceptanceEstimate: the γ policy's running estimate of how many drafts a row keeps (not the accept rule,
which is `sampling.accept`).

Each step's evidence is `core.append.acceptance_counts`: per draft position [reached, kept], from start
state 0 and from state 1 (the row's last step ended in a rejection), on host lists the engine already
copies with its step summary. `AcceptanceEstimate` keeps exponentially decayed counts of them
(`core.rates.DecayedRates`) and turns them into the conditional acceptance α_j per draft position, the
stop rate h and the tokens a row can expect from γ drafts: what `auto.AutoGamma` chooses with (docstrings
below say how).
"""

from __future__ import annotations

import torch

from ..core.append import acceptance_counts
from ..core.rates import PRIOR_ACCEPTANCE, DecayedRates

PRIOR_ROWS = 2  # the pooled α starts at PRIOR_ACCEPTANCE, worth this many rows of evidence
SHRINK_ROWS = 16  # pseudo-rows pulling each position's α toward the pooled one
MEMORY_ROWS = 4  # steps of fewer live rows decay the counts less (memory in evidence, not in steps)
PRIOR_TOKENS = 32  # the stop rate h starts at 0 stops in this many emitted tokens


class AcceptanceEstimate:
    """Conditional acceptance α_j per draft position, from exponentially decayed counts.

    Every step decays all counts by `decay` (memory ~1/(1 - decay) steps at any batch size) and adds
    the step's kept/reached rows per position. Positions share strength: α_j is position j's counts
    shrunk toward the pooled acceptance of all positions by `SHRINK_ROWS` pseudo-rows, and the pooled
    rate starts from `PRIOR_ROWS` pseudo-rows at `PRIOR_ACCEPTANCE`. So one unlucky rejection at a
    deep position (a batch of one row) cannot pin γ below it, and positions never drafted take the
    pooled rate instead of a fixed prior.

    Acceptance is autocorrelated along a row: a step that starts right after a rejection starts in
    text the drafter just got wrong, and its first drafts are kept less often (demo models, T = 1:
    0.73–0.78 at positions 1–2 after a rejection, 0.85–0.90 otherwise). Long drafts end in a
    rejection more often, so under a larger γ more steps start in that state — a per-step estimate
    taken at a small γ overstates what a large one gains. So counts are also kept per start state
    (0: the row's last speculative step kept every draft, or the row is new; 1: it ended in a
    rejection), α^s_j shrunk toward α_j, and the tokens expected from γ mix the two states at their
    long-run shares under γ: P(state 0) = S¹_γ / (S¹_γ + 1 − S⁰_γ), with S^s_γ the chance that a
    step from state s keeps all γ drafts.
    """

    def __init__(self, max_gamma: int, decay: float):
        self.max_gamma = max_gamma
        self.by_state = [DecayedRates(max_gamma), DecayedRates(max_gamma)]  # per start state, per position
        self.stops, self.emitted = 0.0, 0.0  # decayed like the counts: the stop rate h
        self.decay = decay
        self.seen = [False] * max_gamma
        self.alpha = [PRIOR_ACCEPTANCE] * max_gamma  # pooled over start states
        self.alpha_by_state = [list(self.alpha), list(self.alpha)]

    def state_dict(self) -> dict:
        """The counts and the α they give, for a resumed run (`SpecEngine.state_dict`)."""
        return {"max_gamma": self.max_gamma, "by_state": [rates.state_dict() for rates in self.by_state],
                "stops": self.stops, "emitted": self.emitted, "seen": list(self.seen), "alpha": list(self.alpha),
                "alpha_by_state": [list(a) for a in self.alpha_by_state]}

    def load_state_dict(self, state: dict) -> None:
        if state["max_gamma"] != self.max_gamma:
            raise ValueError(f"the saved acceptance estimate has max_gamma={state['max_gamma']!r}; this engine's is "
                             f"{self.max_gamma}: engine.max_gamma must be the saved run's")
        for rates, saved in zip(self.by_state, state["by_state"]):
            rates.load_state_dict(saved)
        self.stops, self.emitted = float(state["stops"]), float(state["emitted"])
        self.seen = [bool(s) for s in state["seen"]]
        self.alpha = [float(a) for a in state["alpha"]]
        self.alpha_by_state = [[float(a) for a in alphas] for alphas in state["alpha_by_state"]]

    @property
    def any_seen(self) -> bool:
        return any(self.seen)

    @property
    def kept(self) -> list[list[float]]:
        """The decayed kept counts, per start state, per position."""
        return [rates.kept for rates in self.by_state]

    @property
    def reached(self) -> list[list[float]]:
        """The decayed reached counts, per start state, per position."""
        return [rates.reached for rates in self.by_state]

    def update(self, accepted: torch.Tensor, decided: torch.Tensor | None = None, emitted: int = 0,
               stopped: int = 0, after_rejection: torch.Tensor | None = None) -> None:
        """Fold in one step from its verdicts: `accepted` [n, γ] bool (prefix-closed), `decided`
        [n, γ] bool (prefix-closed: False past the row's stop token or length limit), `after_rejection`
        [n] bool (the row's start state); `emitted` tokens, `stopped` of them stop tokens."""
        rows, gamma = accepted.shape
        counts = None
        if gamma:
            kept = accepted.sum(1).tolist()
            decided_len = [gamma] * rows if decided is None else decided.sum(1).tolist()
            state = None if after_rejection is None else after_rejection.long().tolist()
            counts = acceptance_counts(kept, decided_len, state, gamma)
        self.update_counts(counts, rows, emitted, stopped)

    def update_counts(self, counts: list[list[int]] | None, rows: int, emitted: int = 0, stopped: int = 0) -> None:
        """Fold in one step of `rows` live rows: `counts` as `acceptance_counts` gives them (None: a
        plain step, which only moves the stop rate)."""
        decay = self.decay
        if rows < MEMORY_ROWS:  # a step of few rows is little evidence: forget less
            decay = decay ** (rows / MEMORY_ROWS)
        self.stops = decay * self.stops + stopped
        self.emitted = decay * self.emitted + emitted
        if not counts:
            return
        for s, rates in enumerate(self.by_state):
            rates.decay(decay)
            for j, (r, k) in enumerate(zip(counts[2 * s], counts[2 * s + 1])):
                if r:
                    self.seen[j] = True
                    rates.add(j, k, r)
        pooled = self.by_state[0] + self.by_state[1]
        self.alpha = pooled.shrunk(pooled.pooled(PRIOR_ACCEPTANCE, PRIOR_ROWS), SHRINK_ROWS)
        self.alpha_by_state = [rates.shrunk(self.alpha, SHRINK_ROWS) for rates in self.by_state]

    @property
    def stop_rate(self) -> float:
        """h: the share of emitted tokens that end their row."""
        return self.stops / (self.emitted + PRIOR_TOKENS)

    def _survival(self) -> list[list[float]]:
        """S^s_k for both start states, k = 0..max_gamma: drafts 1..k kept and no stop token before."""
        keep = 1.0 - self.stop_rate
        out = []
        for alpha in self.alpha_by_state:
            survive, curve = 1.0, [1.0]
            for a in alpha:
                survive *= a * keep
                curve.append(survive)
            out.append(curve)
        return out

    def cumulative(self, gamma: int, survival: list[list[float]] | None = None) -> list[float]:
        """C[k] = Σ_{i≤k} S_i for k = 0..γ under γ's long-run mix of start states: the expected
        tokens of a step with γ drafts whose row has room for k of them."""
        s0, s1 = survival or self._survival()
        share = _state0_share(s0[gamma], s1[gamma])
        total, out = 0.0, []
        for a, b in zip(s0[: gamma + 1], s1[: gamma + 1]):
            total += share * a + (1.0 - share) * b
            out.append(total)
        return out

    def expected_tokens(self, gamma: int) -> float:
        return self.cumulative(gamma)[gamma]

    def batch_tokens(self, rows: int, room: list[int] | None) -> list[float]:
        """Expected tokens of the whole batch for every γ = 0..max_gamma (`room` as in `StepShape`):
        Σ_m room[m] · C_γ[min(γ, m)] — rows with room m < γ stop gaining at C_γ[m]. C_γ mixes the two
        start states' cumulative survival with γ's own share, so one pass over γ serves them all
        (the policy asks every step)."""
        s0, s1 = self._survival()
        out, c0, c1, capped0, capped1, capped_rows = [], 0.0, 0.0, 0.0, 0.0, 0
        for g, (a, b) in enumerate(zip(s0, s1)):
            c0, c1 = c0 + a, c1 + b  # Σ_{i≤γ} S^s_i
            share = _state0_share(a, b)
            rest = rows - capped_rows
            out.append(share * (capped0 + rest * c0) + (1.0 - share) * (capped1 + rest * c1))
            if room is not None and g < len(room):
                capped0, capped1, capped_rows = capped0 + room[g] * c0, capped1 + room[g] * c1, capped_rows + room[g]
        return out


def _state0_share(keep_all_from_0: float, keep_all_from_1: float) -> float:
    """Long-run share of steps that start in state 0 under a γ whose steps keep all their drafts
    with these chances from state 0 and state 1: S¹_γ / (S¹_γ + 1 − S⁰_γ)."""
    churn = keep_all_from_1 + 1.0 - keep_all_from_0
    return keep_all_from_1 / churn if churn > 1e-12 else 1.0
