"""The γ policy's seam: what a policy sees before a step (`StepShape`), what it learns after one
(`StepOutcome`), the `GammaPolicy` protocol the engine calls, and `FixedGamma`, the policy of an int γ.

Before each step the engine hands an adaptive policy the live batch's `StepShape` (rows, KV length, each
row's room left) and asks `choose(shape, greedy)`; after it, `observe(shape, outcome, greedy)`. The
adaptive policies are `auto.AutoGamma` ("auto") and `simple.SimpleGamma` ("auto_simple");
`factory.make_gamma_policy` picks one from `EngineConfig.gamma`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..models.timing import CALIBRATION_CONTEXT


@dataclass
class StepShape:
    """What a policy may look at before a step (the engine fills it only for adaptive policies)."""

    rows: int  # live rows
    context: int = CALIBRATION_CONTEXT  # KV length the step's attention reads (the longest row)
    room: list[int] | None = None  # room[m]: rows whose length budget can use at most m drafts (m ≤ max_gamma)

    @classmethod
    def of_rows(cls, lens: list[int], limits: list[int], max_gamma: int) -> StepShape:
        """The shape of live rows of lengths `lens` and length limits `limits` (host lists)."""
        # Attention reads every row up to the longest one: that is the step's KV length. A row with
        # r tokens left can use r - 1 drafts.
        room = [0] * (max_gamma + 1)
        for length, limit in zip(lens, limits):
            room[min(max(limit - length - 1, 0), max_gamma)] += 1
        return cls(len(lens), max(lens), room)


@dataclass
class StepOutcome:
    """What one step revealed: acceptance counts, tokens emitted, rows ended by a stop token, time."""

    gamma: int
    rows: int
    counts: list[list[int]] | None  # `core.append.acceptance_counts` (host lists); None for a plain step
    emitted: int
    stopped: int
    seconds: float
    draft_seconds: float | None = None  # the part of `seconds` spent drafting
    catch_up: bool = False  # the drafter first caught up on rows it had not drafted for (after a prefill or plain
    # steps: a whole prompt for a head): its time is no steady step's, so the policy learns acceptance from it only


class GammaPolicy(Protocol):
    adaptive: bool  # False: `choose` ignores the shape, and the engine does not compute it

    def choose(self, shape: StepShape, greedy: bool) -> int: ...

    def observe(self, shape: StepShape, outcome: StepOutcome, greedy: bool) -> None: ...

    def narrow(self, shape: StepShape, expected_kept: list[float]) -> int:
        """How many of a proposal's columns to verify, given the drafts expected kept over all rows if
        the first w are (`expected_kept[w]`, w = 0..width): the width whose step pays best."""
        ...

    def break_even_acceptance(self, rows: int, context: int) -> float | None:
        """The per-draft acceptance below which no γ ≥ 1 beats plain decoding at this batch shape
        (`break_even`); None without a cost model to ask."""
        ...

    def state_dict(self) -> dict:
        """What the policy learnt from the steps run (plain data), for a resumed run (`SpecEngine.state_dict`)."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Take back a `state_dict()` of a policy of the same kind and `max_gamma`."""
        ...


class FixedGamma:
    """Always the configured γ (0 = plain decoding)."""

    adaptive = False

    def __init__(self, gamma: int):
        self.gamma = gamma

    def choose(self, shape: StepShape, greedy: bool) -> int:
        return self.gamma

    def observe(self, shape: StepShape, outcome: StepOutcome, greedy: bool) -> None:
        return None

    def narrow(self, shape: StepShape, expected_kept: list[float]) -> int:
        return len(expected_kept) - 1  # no cost model to weigh a column against

    def break_even_acceptance(self, rows: int, context: int) -> float | None:
        return None

    def state_dict(self) -> dict:
        """Nothing is learnt: the configured γ comes with the config."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None

