"""`OverlapChoice`: whether a drafting step drafts the next step beside verification (`EngineConfig.overlap`), from
what each kind of step was measured to deliver.

    choice = OverlapChoice("auto")
    overlapped = choice.choose(rows)                        # before a drafting chain step
    choice.observe(rows, overlapped, emitted, seconds)      # after it

True: every drafting chain step drafts ahead; False: none. "auto": per live batch size (in buckets of powers of two:
1, 2, 3–4, 5–8, …, the sizes a draining batch passes through), the kind of step with more tokens per second, each
kind's rate an exponentially weighted mean of its steps' emitted tokens over their seconds. Both kinds are run
`MEASURE_FIRST` times in a bucket before it chooses (alternating), and the one not chosen again every `RETRY_EVERY`
steps there, so a change of load or acceptance can turn the choice back.

Why measured rates and not a model: drafting ahead changes the step's time only (the drafts, hence what a step keeps,
are a serial step's), and how much depends on what the calibrated forwards cannot see — how often a row's whole step
is kept and its guess right (then its drafting left the step's critical path), whether the drafter's thread finished
before the target's forward did, and, on one CPU split between the two, how each model runs on its share of the
cores. The γ policy meanwhile learns acceptance from every step but step time from serial steps only
(`engine_speculation.EngineSpeculation.observe`): its cost model stays one of serial steps.
"""

from __future__ import annotations

from typing import Literal

MEASURE_FIRST = 4  # steps of each kind in a bucket before the choice there follows the rates
RETRY_EVERY = 32  # steps in a bucket between runs of the kind not chosen
EMA = 0.8  # weight of a bucket's old rate against a new step's

OverlapSetting = bool | Literal["auto"]


class OverlapChoice:
    """Chooses drafting ahead per step (module docstring); `setting` is `EngineConfig.overlap`."""

    def __init__(self, setting: OverlapSetting):
        self.setting = setting
        self.rates: dict[tuple[int, bool], float] = {}  # (bucket, drafts ahead) → tokens per second
        self.steps: dict[tuple[int, bool], int] = {}  # (bucket, drafts ahead) → steps measured
        self.since_retry: dict[int, int] = {}  # bucket → steps since the kind not chosen last ran

    @staticmethod
    def bucket(rows: int) -> int:
        """The live batch size's bucket: 1 → 1, 2 → 2, 3–4 → 3, 5–8 → 4, …"""
        return max(rows - 1, 0).bit_length() + 1 if rows > 1 else 1

    def choose(self, rows: int) -> bool:
        """Whether the next drafting step of `rows` live rows drafts ahead."""
        if self.setting != "auto":
            return bool(self.setting)
        bucket = self.bucket(rows)
        counts = [self.steps.get((bucket, kind), 0) for kind in (False, True)]
        if min(counts) < MEASURE_FIRST:
            return counts[True] <= counts[False]  # alternate, drafting ahead first
        best = self.rates[bucket, True] > self.rates[bucket, False]
        due = self.since_retry.get(bucket, 0) + 1
        self.since_retry[bucket] = 0 if due >= RETRY_EVERY else due
        return not best if due >= RETRY_EVERY else best

    def observe(self, rows: int, overlapped: bool, emitted: int, seconds: float) -> None:
        """A drafting step of `rows` live rows, drafting ahead or not, emitted `emitted` tokens in `seconds`."""
        if self.setting != "auto" or seconds <= 0:
            return
        key = (self.bucket(rows), overlapped)
        rate = emitted / seconds
        old = self.rates.get(key)
        self.rates[key] = rate if old is None else EMA * old + (1 - EMA) * rate
        self.steps[key] = self.steps.get(key, 0) + 1

    def rate(self, rows: int, overlapped: bool) -> float | None:
        """The measured tokens per second of that kind of step at this batch size's bucket (None: not measured)."""
        return self.rates.get((self.bucket(rows), overlapped))
