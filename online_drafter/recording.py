"""RecordingLearner: an `OnlineLearner` that saves every input it is given, for replaying a run's learner.

Drafter LMs only (`DraftLearner`): a head's learner also reads the policy's embedding and LM head,
which every policy sync changes and a recording does not hold.

With `learner.record_dir` set (YAML, or `LearnerConfig(record_dir=...)`), `make_online_learner` wraps
the learner in this recorder. It writes, in call order, into that folder:

- `init.pt`: the drafter as given (the frozen one) and the `LearnerConfig`;
- `000001_add.pt`, `000002_round.pt`, `000003_probe.pt`, ...: each call's input — the rollouts (with
  their signals) for `add_rollouts` and `probe`, `budget_s` and `break_even` for `train_round` — and the
  seconds since the first call.

Everything a round decides depends only on these inputs and on time, so `python -m
specroll.benchmarks.learner_replay DIR` reruns the learner on them under any other settings, with a
virtual clock: with `engine.sampler: invariant` every run of a config produces the same rollouts, and
a recorded run is the one input a settings comparison needs. A main job's recording takes ~20 MB.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specroll.rollout import Rollout

from .reports import LearnerReport, ProbeReport


class RecordingLearner:
    """Delegates to `learner` (a `DraftLearner` or `HeadLearner`) and saves each call's input to `folder`."""

    def __init__(self, learner: Any, folder: str | os.PathLike, drafter: nn.Module):
        self.learner = learner
        self.folder = Path(folder)
        if self.folder.exists() and any(self.folder.iterdir()):
            raise ValueError(f"learner.record_dir={str(folder)!r} is invalid: it is not empty (a recording "
                             "is one run: give each run its own folder)")
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.save({"drafter": drafter, "config": asdict(learner.config)},
                   self.folder / "init.pt")
        self._calls = 0
        self._started: float | None = None

    @property
    def version(self) -> int:
        return self.learner.version

    def add_rollouts(self, rollouts: list[Rollout]) -> None:
        self._record("add", list(rollouts))
        self.learner.add_rollouts(rollouts)

    def train_round(self, budget_s: float | None = None, break_even: float | None = None) -> LearnerReport:
        report = self.learner.train_round(budget_s=budget_s, break_even=break_even)
        self._record("round", {"budget_s": budget_s, "break_even": break_even, "round_time_s": report.round_time_s})
        return report

    def probe(self, rollouts: list[Rollout]) -> ProbeReport:
        self._record("probe", list(rollouts))
        return self.learner.probe(rollouts)

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        return self.learner.published_state_dict()

    def _record(self, kind: str, payload: Any) -> None:
        now = time.perf_counter()
        self._started = now if self._started is None else self._started
        self._calls += 1
        torch.save({"kind": kind, "payload": payload, "t": now - self._started},
                   self.folder / f"{self._calls:06d}_{kind}.pt")


def recorded_calls(folder: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A recording's `init.pt` and its calls in order; a folder that holds none is a `ValueError`."""
    folder = Path(folder)
    if not (folder / "init.pt").is_file():
        raise ValueError(f"{str(folder)!r} holds no learner recording (no init.pt): record a run with "
                         "learner.record_dir")
    init = torch.load(folder / "init.pt", weights_only=False)
    calls = [torch.load(path, weights_only=False) for path in sorted(folder.glob("[0-9]*_*.pt"))]
    return init, calls
