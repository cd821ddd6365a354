"""Candidate: the online learner's private trained copy of a drafter, and the average of it that is judged.

The learner trains `model` (fp32, AdamW) teacher-forced on batches its buffer draws, and judges and
publishes `averaged`, an exponential average of the trained weights (`ema_decay`; the trained weights
themselves when 0): on a drafter already close to the policy, single steps at the demo's lr are mostly
noise, their average is not. A fresh or restarted candidate's optimizer warms its learning rate up
linearly over `warmup_steps`: Adam's first steps move every parameter by ~lr whatever its gradient,
which the gate would then have to wait out. The same for every drafter kind: the learner passes the
loss (`scorer.loss`) and the batches (`buffer.sample_batches`).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..learner_config import LearnerConfig

# Batches drawn at once, then grouped by length (`sample_batches`). More groups waste less padding but
# make batches more alike (on the demo, length goes with style): replayed on a recorded main-job run, 4
# took ~1.5x the optimizer steps of 1 in the same budget and recovered as much; 8 recovered less.
BATCHES_PER_DRAW = 4


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)  # one per optimizer step
    num_positions: int = 0  # completion positions trained on (with repeats)
    seconds: float = 0.0


class Candidate:
    def __init__(self, drafter: nn.Module, config: LearnerConfig, device: torch.device):
        self.config = config
        self.device = device
        self.model = copy.deepcopy(drafter).to(device, torch.float32).requires_grad_(True)
        self.averaged = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = self._fresh_optimizer()
        self.step_s = 0.0  # the mean optimizer step of the last round that took one

    def train(self, draw: Callable[[int], list[Any]], loss: Callable[[nn.Module, Any], torch.Tensor],
              deadline: float | None, clock: Callable[[], float] = time.perf_counter,
              stop: Callable[[], bool] | None = None) -> TrainResult:
        """Optimizer steps until `config.max_steps`, before one would end past `deadline` (`clock()`
        seconds), or once `stop()` says so (checked before every step but the first: a round the trainer
        collects before its first step still takes one — stopped before it, a learner whose probe outlasts a
        short update never trained, and the silent-learner alarm fired; one step is 0.1-0.5 s against updates of
        seconds); `draw(n)` returns n batches, `loss(model, batch)` a scalar."""
        cfg, result = self.config, TrainResult()
        started = clock()
        batches: list[Any] = []
        self.model.train()
        for step in range(cfg.max_steps):
            # Judged by the mean step so far, or before this round's first by the last round's (a round
            # with too little budget for one step takes none).
            per_step = (clock() - started) / step if step else self.step_s
            if (deadline is not None and clock() + per_step >= deadline) or (step and stop is not None and stop()):
                break
            if not batches:
                batches = draw(BATCHES_PER_DRAW)
            batch = batches.pop().to(self.device)
            value = loss(self.model, batch)
            self.optimizer.zero_grad(set_to_none=True)
            value.backward()
            self._warm_up()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self._average()
            result.losses.append(float(value.detach()))
            result.num_positions += int((batch.weights > 0).sum())
        self.model.eval()
        result.seconds = clock() - started
        if result.losses:
            self.step_s = smoothed(self.step_s, result.seconds / len(result.losses))
        return result

    @torch.no_grad()
    def restart(self, weights: dict[str, torch.Tensor]) -> None:
        """Restart from `weights` (trained and averaged alike) with a fresh optimizer."""
        for model in (self.model, self.averaged):
            for name, param in model.named_parameters():
                param.copy_(weights[name])
        self.optimizer = self._fresh_optimizer()

    def _fresh_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay)

    @torch.no_grad()
    def _average(self) -> None:
        for average, param in zip(self.averaged.parameters(), self.model.parameters()):
            average.lerp_(param.detach(), 1.0 - self.config.ema_decay)

    def _warm_up(self) -> None:
        done = max((int(s["step"]) for s in self.optimizer.state.values() if "step" in s), default=0)
        steps = self.config.warmup_steps
        scale = min(1.0, (done + 1) / steps) if steps else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr * scale


def weights_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of `model`'s parameters."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def smoothed(estimate: float, measured: float) -> float:
    """Geometric mean of the running estimate and a new measurement (the measurement alone at first):
    one round slowed by a busy machine moves the next round's estimate by √, not by the whole spike."""
    return measured if estimate <= 0 else math.sqrt(estimate * measured)
