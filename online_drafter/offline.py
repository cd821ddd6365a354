"""Offline training: a drafter trained by the online learner on a fixed set of the policy's samples, over a budget.

    schedule = OfflineSchedule(budget_s=900, round_s=100)
    result = train_offline(head, policy, samples, schedule, max_positions=sum(s.num_positions for s in samples))

The one recipe behind `specroll distill` and the demo's first feature heads (`specroll.demo.heads`): the learner
`make_online_learner` picks for the drafter — its loss, its held-out set (every 4th prompt group) and its
publish-if-better gate — in two phases, `lr` for two thirds of the budget and then `final_lr` (one phase when they
are equal), each phase a fresh learner on the same samples, so on the same held-out groups. Measured on the demo's
EAGLE head: 0.903 held out after 600 s at 1e-3, 0.923 after 300 s more at 2e-4, where 600 s more at 1e-3 had been
gaining ~0.2 points per 100 s. No averaging, warmup or gate margin: a fresh drafter starts far from any good one.

The budget counts whole rounds, gates included: a phase's rounds share the time it has left, so a gate that overran
its round is taken from the next ones. With `resume` set, the learner's state and the rounds so far are saved after
every round and a later call picks up where that one stopped.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from specroll.rollout.drafters.draft_vocab import split_state
from specroll.rollout.models.weights import copy_into

from .learner_config import LearnerConfig
from .online_learner import make_online_learner
from .state.learner_state import restore, state_of


@dataclass
class OfflineSchedule:
    """The budget and settings of an offline run. `budget_s`: training seconds, gates included; `round_s`: training
    between two gates; `lr` for the first two thirds, `final_lr` for the last (equal: one phase); `temperature`: the
    samples' (the learner's q is the drafter's softmax at it)."""

    budget_s: float
    round_s: float
    lr: float = 1e-3
    final_lr: float = 2e-4
    batch_size: int = 16
    temperature: float = 1.0
    device: str = "cpu"

    def __post_init__(self):
        for name in ("budget_s", "round_s", "lr", "final_lr", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"OfflineSchedule.{name}={getattr(self, name)!r} is invalid: a number > 0")
        if self.batch_size < 1:
            raise ValueError(f"OfflineSchedule.batch_size={self.batch_size!r} is invalid: an int >= 1")

    def phases(self) -> list[tuple[float, float]]:
        """(lr, share of the budget) per phase."""
        return [(self.lr, 2 / 3), (self.final_lr, 1 / 3)] if self.final_lr != self.lr else [(self.lr, 1.0)]

    def num_rounds(self, share: float) -> int:
        return max(1, round(self.budget_s * share / self.round_s))


@dataclass
class OfflineResult:
    """Each round's report (`LearnerReport` fields, with its `phase`, `lr` and `served`: the published drafter's
    held-out estimate after it), and the published drafter's final held-out expected acceptance (nan: no round)."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    acceptance: float = math.nan


def train_offline(drafter: Any, policy: Any, samples: list[Any], schedule: OfflineSchedule, max_positions: int,
                  resume: Path | None = None, draft_ids: torch.Tensor | None = None,
                  desc: str = "training the drafter") -> OfflineResult:
    """Train `drafter` in place on `samples` (feature sequences for a head, rollouts with signals for a drafter LM;
    `max_positions`: their completion positions, all kept in the buffer) under `schedule`; `drafter` ends holding
    the published weights. `resume`: the file to save the state to after every round and to resume from. `draft_ids`:
    the draft vocabulary the learner trains and scores over (None: the whole one), fixed: the samples are."""
    saved = torch.load(resume, weights_only=False) if resume is not None and resume.is_file() else None
    result = OfflineResult(saved["rounds"] if saved else [])
    rounds = result.rounds
    phases = schedule.phases()
    bar = tqdm(total=sum(schedule.num_rounds(share) for _, share in phases), initial=len(rounds), desc=desc,
               unit="round")
    learner = None
    for phase, (lr, share) in enumerate(phases):
        if saved is not None and saved["phase"] > phase:  # done: the saved later phase started from its drafter
            continue
        count = schedule.num_rounds(share)
        config = LearnerConfig(lr=lr, batch_size=schedule.batch_size, max_steps=10**9, gate_z=0.0, ema_decay=0.0,
                               warmup_steps=0, holdout_fraction=0.25, temperature=schedule.temperature,
                               device=schedule.device)
        config = dataclasses.replace(config, buffer=dataclasses.replace(config.buffer, max_positions=max_positions))
        learner = make_online_learner(drafter, policy, config)
        in_phase = sum(1 for r in rounds if r["phase"] == phase)
        if saved is not None and saved["phase"] == phase:
            restore(learner, saved["learner"], f"the saved learner in {resume}")
        elif in_phase < count:
            learner.add_rollouts(samples)
            if draft_ids is not None:  # after the samples: the learner counts none, so it never recounts the subset
                learner.set_draft_vocab(draft_ids, policy.config.get_text_config().vocab_size)
        for done in range(in_phase, count):
            # the phase's time left, shared by its rounds left: a gate that overran a round is taken from the next
            left = schedule.budget_s * share - sum(r["round_time_s"] for r in rounds if r["phase"] == phase)
            if left <= 0:
                break
            report = learner.train_round(budget_s=left / (count - done))
            served = learner.served_estimate()  # the published drafter's held-out score, as the gate left it
            rounds.append({"phase": phase, "lr": lr, "served": served, **dataclasses.asdict(report)})
            if resume is not None:
                torch.save({"phase": phase, "rounds": rounds, "learner": state_of(learner)}, resume.with_suffix(".tmp"))
                resume.with_suffix(".tmp").replace(resume)
            bar.update(1)
            bar.set_postfix(accept=f"{served:.3f}", version=report.version)
        if in_phase < count or (saved is not None and saved["phase"] == phase):
            copy_into(drafter, split_state(learner.published_state_dict())[0], "the distilled drafter")
        saved = None
    bar.close()
    if rounds:
        result.acceptance = learner.served_estimate()
    return result
