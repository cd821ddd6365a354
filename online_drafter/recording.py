"""RecordingLearner: an `OnlineLearner` that saves every input it is given, for replaying a run's learner.

A drafter LM's learner (`lm.learner.DraftLearner`) or a head's (`heads.learner.HeadLearner`). A head's
learner also reads the policy's embedding and LM head, which every policy sync changes in place: the
recorder is given those modules (`reads`), and saves their weights before any call that finds them changed.

With `learner.record_dir` set (YAML, or `LearnerConfig(record_dir=...)`), `make_online_learner` wraps
the learner in this recorder. It writes, in call order, into that folder:

- `init.pt`: the drafter as given (the frozen one), the `LearnerConfig` and, for a head, a copy of the
  policy modules it reads (`reads`: {"embed": ..., "lm_head": ...});
- `000001_add.pt`, `000002_round.pt`, `000003_probe.pt`, ...: each call's input — the rollouts (with
  their signals) for `add_rollouts` and `probe`, `budget_s` and `break_even` for `train_round`, and for a
  head `policy`: the read modules' new weights, saved before the call that first sees them — and the
  seconds since the first call.

Everything a round decides depends only on these inputs and on time, so `python -m
specroll.tools.learner_replay DIR` reruns the learner on them under any other settings, with a
virtual clock: with `engine.sampler: invariant` every run of a config produces the same rollouts, and
a recorded run is the one input a settings comparison needs. A main job's recording takes ~20 MB
(a head's ~70 MB: its rollouts carry the policy's hidden states, 1 KiB per position for the demo).

A recording pickles classes by their module path (`Rollout`, the drafter): `recorded_calls` reads it
through `moved_paths.load_moved`, so a recording made before a module moved still loads; and a transformers
model in it is rebuilt from its config and weights (`_rebuilt`), so one pickled by another transformers version
(whose classes set other attributes in `__init__`: 5.25's kernel wrappers) still runs.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specroll.rollout import Rollout

from .moved_paths import load_moved
from .reports import LearnerReport, ProbeReport


class RecordingLearner:
    """Delegates to `learner` (a `DraftLearner` or `HeadLearner`) and saves each call's input to `folder`."""

    def __init__(self, learner: Any, folder: str | os.PathLike, drafter: nn.Module,
                 reads: dict[str, nn.Module] | None = None):
        self.learner = learner
        self.folder = Path(folder)
        if self.folder.exists() and any(self.folder.iterdir()):
            raise ValueError(f"learner.record_dir={str(folder)!r} is invalid: it is not empty (a recording "
                             "is one run: give each run its own folder)")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.reads = reads or {}
        self._read_weights = self._current_reads()
        torch.save({"drafter": drafter, "config": asdict(learner.config),
                    "reads": {name: copy.deepcopy(module) for name, module in self.reads.items()}},
                   self.folder / "init.pt")
        self._calls = 0
        self._started: float | None = None

    @property
    def version(self) -> int:
        return self.learner.version

    def set_draft_vocab(self, ids: torch.Tensor, vocab_size: int) -> None:
        self._record("vocab", {"ids": torch.as_tensor(ids).clone(), "vocab_size": vocab_size})
        self.learner.set_draft_vocab(ids, vocab_size)

    def draft_vocab(self, name: str = "published") -> torch.Tensor | None:
        return self.learner.draft_vocab(name)

    def add_rollouts(self, rollouts: list[Rollout]) -> None:
        self._record("add", list(rollouts))
        self.learner.add_rollouts(rollouts)

    def train_round(self, budget_s: float | None = None, break_even: float | None = None,
                    stop: Callable[[], bool] | None = None) -> LearnerReport:
        self._save_reads_if_changed()  # the round is saved after it ran (with its time): the weights it read, before
        report = self.learner.train_round(budget_s=budget_s, break_even=break_even, stop=stop)
        if stop is not None and stop():  # stopped early: a replay gets the time it had
            budget_s = report.round_time_s
        self._save("round", {"budget_s": budget_s, "break_even": break_even, "round_time_s": report.round_time_s})
        return report

    def probe(self, rollouts: list[Rollout]) -> ProbeReport:
        self._record("probe", list(rollouts))
        return self.learner.probe(rollouts)

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        return self.learner.published_state_dict()

    def served_estimate(self) -> float:
        return self.learner.served_estimate()

    def revert_served(self, reason: str) -> str:
        self._record("revert", reason)
        return self.learner.revert_served(reason)

    def _current_reads(self) -> dict[str, dict[str, torch.Tensor]]:
        return {name: {k: v.detach().clone() for k, v in module.state_dict().items()}
                for name, module in self.reads.items()}

    def _save_reads_if_changed(self) -> None:
        """Save the read modules' weights as a "policy" call if a sync changed them since last saved."""
        if not self.reads:
            return
        now_reads = self._current_reads()
        if any(not torch.equal(now_reads[name][key], value)
               for name, saved in self._read_weights.items() for key, value in saved.items()):
            self._read_weights = now_reads
            self._save("policy", now_reads)

    def _record(self, kind: str, payload: Any) -> None:
        self._save_reads_if_changed()
        self._save(kind, payload)

    def _save(self, kind: str, payload: Any) -> None:
        now = time.perf_counter()
        self._started = now if self._started is None else self._started
        self._calls += 1
        torch.save({"kind": kind, "payload": payload, "t": now - self._started},
                   self.folder / f"{self._calls:06d}_{kind}.pt")


def recorded_calls(folder: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A recording's `init.pt` and its calls in order (classes that moved since followed: `moved_paths`); a
    folder that holds none is a `ValueError`."""
    folder = Path(folder)
    if not (folder / "init.pt").is_file():
        raise ValueError(f"{str(folder)!r} holds no learner recording (no init.pt): record a run with "
                         "learner.record_dir")
    init = load_moved(folder / "init.pt")
    init["drafter"] = _rebuilt(init["drafter"])
    if init.get("reads"):
        init["reads"] = {name: _rebuilt(module) for name, module in init["reads"].items()}
    calls = [load_moved(path) for path in sorted(folder.glob("[0-9]*_*.pt"))]
    return init, calls


def _rebuilt(module: Any) -> Any:
    """A transformers model unpickled from a recording, built again from its config with its weights, dtype
    and mode (unpickling skips `__init__`, so attributes a newer transformers sets there are missing); any
    other object as it is."""
    from transformers import PreTrainedModel

    from specroll.rollout.models.weights import cast_module

    if not isinstance(module, PreTrainedModel):
        return module
    weight = next(module.parameters())
    fresh = cast_module(type(module)(module.config), weight.device, weight.dtype)
    fresh.load_state_dict(module.state_dict())
    return fresh.train(module.training)
