"""HeadLearner: trains an EAGLE-style head or Medusa heads on the policy's own features, publish-if-better.

Usage (the engine runs an "eagle" or "medusa" drafter with `record_signals=True`, so every rollout
carries the target's hidden states and top-k p)::

    learner = HeadLearner(head, target.get_input_embeddings(), target.get_output_embeddings())
    learner.add_rollouts(rollouts)
    report = learner.train_round(budget_s=...)              # while the trainer updates the policy
    if report.published:
        engine.update_drafter(learner.published_state_dict(), learner.version)

The same decisions as `learner.DraftLearner`, on the head's own data: a private fp32 *candidate*
trained teacher-forced (`head_objectives`) with the bucketed KL or TV to the recorded top-k p
(`divergence`); every `holdout_every`-th prompt group held out; the candidate published only when its
paired gain over the published head on the held-out groups clears `gate_z` standard errors
(`paired`); the *frozen* shadow (the head as given) scored on the same positions. The target's
embedding and LM head are read, never trained: they are the policy's, and follow it.

Memory is bounded by `max_positions` buffered sequence positions (oldest sequences go first), each
costing 2·H + 8 bytes of features and ids plus 12·k of top-k (the demo target, H = 512, k = 16:
~1.2 KiB per position; 200k positions ≈ 240 MB).

Layer-skip self-speculation has nothing to train: its draft is the policy itself, truncated.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from specroll.rollout import Rollout

from .divergence import LOSSES, expected_acceptance
from .head_data import FeatureBatch, FeatureSequence, collate, from_rollout
from .head_objectives import HeadObjective, objective_for
from .paired import GroupScores, paired_gain


@dataclass
class HeadLearnerConfig:
    lr: float = 1e-3
    batch_size: int = 16
    loss: str = "kl"
    temperature: float = 1.0
    feature_weight: float = 1.0  # EAGLE's feature-regression term
    holdout_every: int = 4  # every k-th prompt group is held out
    max_positions: int = 200_000
    gate_z: float = 1.0
    max_steps: int = 200  # per round
    eval_batch_size: int = 32
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} is invalid: one of {sorted(LOSSES)}")
        for name in ("batch_size", "holdout_every", "max_positions", "max_steps", "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: an int >= 1")
        if not self.lr > 0 or not self.temperature > 0:
            raise ValueError(f"lr={self.lr!r}, temperature={self.temperature!r}: both must be > 0")


@dataclass
class HeadRoundReport:
    steps: int
    train_loss: float
    candidate: float  # held-out expected acceptance per draft depth, averaged over depths
    published_score: float
    frozen: float
    gain: float  # candidate − published (paired) and its standard error
    gain_se: float
    published: bool  # this round published a new version
    version: int
    holdout_positions: int
    seconds: float


class HeadLearner:
    def __init__(self, head: nn.Module, embed: nn.Module, lm_head: nn.Module, config: HeadLearnerConfig | None = None):
        self.config = config = config or HeadLearnerConfig()
        self.device = torch.device(config.device)
        self.model = copy.deepcopy(head).to(self.device, torch.float32).train().requires_grad_(True)
        self.published_head = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.frozen = copy.deepcopy(self.model).eval().requires_grad_(False)
        # Private frozen copies of the policy's embedding and LM head: no gradient reaches the policy.
        embed, lm_head = (copy.deepcopy(m).to(self.device, torch.float32).requires_grad_(False)
                          for m in (embed, lm_head))
        self.objective: HeadObjective = objective_for(head, embed, lm_head, config.feature_weight)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr)
        self.train_set: deque[FeatureSequence] = deque()
        self.holdout: deque[FeatureSequence] = deque()
        self._positions = 0
        self._groups: dict[tuple[int, int], bool] = {}  # group → held out
        self._random = random.Random(config.seed)
        self.version = 0

    def add(self, sequences: Iterable[FeatureSequence]) -> None:
        for seq in sequences:
            held = self._groups.setdefault(seq.group, len(self._groups) % self.config.holdout_every == 0)
            (self.holdout if held else self.train_set).append(seq)
            self._positions += seq.token_ids.shape[0]
        while self._positions > self.config.max_positions and (self.train_set or self.holdout):
            older = self.train_set if len(self.train_set) >= 3 * len(self.holdout) else self.holdout
            self._positions -= (older or self.train_set or self.holdout).popleft().token_ids.shape[0]

    def add_rollouts(self, rollouts: Iterable[Rollout]) -> None:
        """`add` the rollouts' recorded features (`head_data.from_rollout`; empty completions skipped) — the
        call `DraftLearner` takes, so a backend feeds either learner alike."""
        self.add(from_rollout(r) for r in rollouts if r.completion_ids)

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().clone() for name, t in self.published_head.state_dict().items()}

    def train_round(self, budget_s: float = math.inf, max_steps: int | None = None) -> HeadRoundReport:
        """Train the candidate for up to `max_steps` (config's by default) within `budget_s`, then gate."""
        if not self.train_set:
            raise ValueError("train_round needs training sequences: add() rollouts first")
        started, losses = time.perf_counter(), []
        loss_fn = LOSSES[self.config.loss]
        self.model.train()
        for _ in range(max_steps or self.config.max_steps):
            batch = collate(self._sample()).to(self.device)
            out = self.objective(self.model, batch, self.config.temperature)
            per_position = torch.stack([loss_fn(out.log_q[:, d], batch.topk_ids, batch.topk_probs)
                                        for d in range(out.log_q.shape[1])], 1)  # [B, D, L]
            loss = (per_position * batch.weights[:, None]).sum() / (batch.weights.sum() * out.log_q.shape[1])
            loss = loss + out.aux_loss
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss.detach()))
            if time.perf_counter() - started > budget_s:
                break
        self.model.eval()
        return self._gate(len(losses), sum(losses) / len(losses), started)

    def score(self, head: nn.Module, sequences: list[FeatureSequence]) -> GroupScores:
        """Expected acceptance Σ min(p, q) per prompt group, averaged over the head's draft depths."""
        index: dict[tuple[int, int], int] = {}
        sums, counts = [], []
        with torch.inference_mode():
            for start in range(0, len(sequences), self.config.eval_batch_size):
                chunk = sequences[start : start + self.config.eval_batch_size]
                batch: FeatureBatch = collate(chunk).to(self.device)
                log_q = self.objective(head, batch, self.config.temperature).log_q  # [B, D, L, V]
                acc = torch.stack([expected_acceptance(log_q[:, d], batch.topk_ids, batch.topk_probs)
                                   for d in range(log_q.shape[1])], 1).mean(1)  # [B, L]
                per_seq = (acc * batch.weights).sum(1).double().cpu().tolist()
                for seq, value in zip(chunk, per_seq):
                    g = index.setdefault(seq.group, len(index))
                    if g == len(sums):
                        sums.append(0.0)
                        counts.append(0.0)
                    sums[g] += value
                    counts[g] += seq.num_positions
        return GroupScores(torch.tensor(sums, dtype=torch.float64), torch.tensor(counts, dtype=torch.float64))

    def _sample(self) -> list[FeatureSequence]:
        """A batch drawn with the newest half of the buffer twice as likely (the policy moves)."""
        size = min(self.config.batch_size, len(self.train_set))
        n = len(self.train_set)
        weights = [1.0 if i < n // 2 else 2.0 for i in range(n)]
        return self._random.choices(list(self.train_set), weights=weights, k=size)

    def _gate(self, steps: int, train_loss: float, started: float) -> HeadRoundReport:
        holdout = list(self.holdout)
        if not holdout:
            nan = math.nan
            return HeadRoundReport(steps, train_loss, nan, nan, nan, nan, math.inf, False, self.version, 0,
                                   time.perf_counter() - started)
        candidate = self.score(self.model, holdout)
        published = self.score(self.published_head, holdout)
        frozen = self.score(self.frozen, holdout)
        gain = paired_gain(candidate, published)
        publish = gain.above(self.config.gate_z)
        if publish:
            self.published_head.load_state_dict(self.model.state_dict())
            self.version += 1
        return HeadRoundReport(steps, train_loss, candidate.mean, published.mean, frozen.mean, gain.mean, gain.se,
                               publish, self.version, candidate.num_positions, time.perf_counter() - started)
