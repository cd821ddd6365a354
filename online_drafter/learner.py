"""DraftLearner: distils the drafter toward the moving policy between RL steps, publish-if-better.

Usage (the loop DESIGN.md draws; `engine` is a `SpecEngine` with `record_signals=True`)::

    learner = DraftLearner(drafter, LearnerConfig(max_steps=50))
    for step in range(num_steps):
        rollouts = engine.generate(prompts, params)        # signals come with verification
        learner.add_rollouts(rollouts)
        ...                                                 # trainer updates the policy
        report = learner.train_round()                      # while the workers would sit idle
        if report.published:
            engine.update_drafter(learner.published_state_dict(), learner.version)

The learner trains a private fp32 copy of the drafter, teacher-forced on buffered contexts, with
the bucketed forward KL to the target's recorded top-k (`divergence.py` says why). It never holds
the target: everything it knows of p is the recorded top-k, so no gradient can reach the policy.

A stride-chosen `holdout_fraction` of each policy version's prompt groups is held out; only the newest
version's are scored (older held-out rollouts join the training buffer when a new version comes).
Each round scores the published drafter, the candidate and a frozen copy of the initial drafter
(the *shadow*, what no online learning would give) by expected acceptance Σ min(p, q) on those
positions; the candidate becomes the next version only if it beats the published one by more than
`min_improvement` (and is no worse than the shadow), otherwise the learner reverts to the published
weights and the version stays — unless the shadow beats both, in which case the initial drafter is
published again as the next version (a run of small held-out wins can drift below where it started).
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import asdict, dataclass

import torch

from specroll.rollout import Rollout
from specroll.rollout.weights import copy_into

from .batch import BufferedRollout, DraftBatch, collate
from .buffer import DraftBuffer, to_buffered
from .checkpoint import load_checkpoint, save_checkpoint
from .divergence import LOSSES, expected_acceptance

CHECKPOINT_KEYS = ("config", "version", "published", "frozen", "optimizer", "buffer", "holdout", "holdout_version",
                   "num_seen_newest", "generator")


@dataclass
class LearnerConfig:
    """Per-round budget (`max_steps`, optional `time_budget_s` for the whole round, evaluation
    included), AdamW settings, and the evaluation.

    `temperature` must be the rollouts' sampling temperature (1.0 for greedy rollouts, whose signals
    are the T = 1 distribution): q is the drafter's softmax at that temperature, as the engine does.
    """

    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 16
    max_steps: int = 50
    time_budget_s: float | None = None
    loss: str = "kl"
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    holdout_fraction: float = 0.2
    max_holdout_positions: int = 20_000
    min_improvement: float = 0.0
    eval_batch_size: int = 64
    device: str = "cpu"
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            ("lr", self.lr > 0, "a number > 0"),
            ("weight_decay", self.weight_decay >= 0, "a number >= 0"),
            ("batch_size", isinstance(self.batch_size, int) and self.batch_size >= 1, "an int >= 1"),
            ("max_steps", isinstance(self.max_steps, int) and self.max_steps >= 0, "an int >= 0"),
            ("time_budget_s", self.time_budget_s is None or self.time_budget_s > 0, "None or a number > 0"),
            ("loss", self.loss in LOSSES, f"one of {sorted(LOSSES)}"),
            ("temperature", self.temperature > 0, "a number > 0 (1.0 for greedy rollouts)"),
            ("max_grad_norm", self.max_grad_norm > 0, "a number > 0"),
            ("holdout_fraction", 0 < self.holdout_fraction < 1, "a number in (0, 1)"),
            ("max_holdout_positions", isinstance(self.max_holdout_positions, int) and self.max_holdout_positions >= 1,
             "an int >= 1"),
            ("min_improvement", self.min_improvement >= 0, "a number >= 0"),
            ("eval_batch_size", isinstance(self.eval_batch_size, int) and self.eval_batch_size >= 1,
             "an int >= 1"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: {allowed}")


@dataclass
class LearnerReport:
    """One round. Acceptances are expected acceptance Σ min(p, q) on the newest version's held-out
    positions: the published drafter before the round, the candidate after it, the frozen shadow."""

    published: bool
    version: int  # drafter version after the round (moved only if published)
    acceptance_before: float
    acceptance_after: float
    acceptance_frozen_shadow: float
    loss: float  # mean training loss over the round's steps (nan without steps)
    train_time_s: float  # optimizer steps
    eval_time_s: float  # held-out scoring
    round_time_s: float  # the whole round: what it costs in idle worker time
    num_positions: int  # completion positions trained on (with repetition)
    num_steps: int
    num_holdout_positions: int
    policy_version: int  # the policy version the held-out rollouts came from
    reverted_to_frozen: bool = False  # published the initial drafter again: it beat both on held-out


class DraftLearner:
    """Online drafter distillation with held-out, publish-if-better versioning (see module doc)."""

    def __init__(self, drafter: torch.nn.Module, config: LearnerConfig | None = None,
                 buffer: DraftBuffer | None = None):
        self.config = config = config or LearnerConfig()
        self.device = torch.device(config.device)
        self.model = copy.deepcopy(drafter).to(self.device, torch.float32)
        self.frozen = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.buffer = buffer if buffer is not None else DraftBuffer()
        self.holdout: list[BufferedRollout] = []
        self.holdout_version = -1
        self.version = 0
        self._published = self._snapshot()
        self._optimizer = self._make_optimizer()
        self._generator = torch.Generator().manual_seed(config.seed)
        self._num_seen_newest = 0
        self._holdout_prompts: dict[tuple[int, ...], bool] = {}
        self._frozen_score: float | None = None  # cached until the held-out set changes

    # ------------------------------------------------------------------ public API

    def add_rollouts(self, rollouts: list[Rollout]) -> None:
        """Buffer rollouts (generated with `record_signals=True`), holding some of the newest out."""
        entries = [to_buffered(r) for r in rollouts]
        newest = max((e.policy_version for e in entries), default=self.holdout_version)
        if newest > self.holdout_version:
            self.buffer.add(self.holdout)
            self.holdout, self.holdout_version, self._num_seen_newest = [], newest, 0
            self._holdout_prompts: dict[tuple[int, ...], bool] = {}
        for rollout, entry in zip(rollouts, entries):
            # Whole prompt groups are held out together: a sibling of a training rollout shares its
            # prompt and much of its text, so splitting a group would score the drafter on what it saw.
            key = tuple(rollout.prompt_ids)
            if entry.policy_version == self.holdout_version and key not in self._holdout_prompts:
                self._holdout_prompts[key] = self._next_is_holdout()
            if entry.policy_version == self.holdout_version and self._holdout_prompts[key]:
                self.holdout.append(entry)
            else:
                self.buffer.add([entry])
        while sum(e.num_positions for e in self.holdout) > self.config.max_holdout_positions:
            self.buffer.add([self.holdout.pop(0)])
        self._frozen_score = None

    def train_round(self) -> LearnerReport:
        """Train up to the step/time budget, score on held-out rollouts, publish only if better."""
        if not self.holdout:
            raise ValueError("no held-out rollouts yet: add_rollouts(...) before train_round()")
        started = time.perf_counter()
        before = self.score(self.model)
        # The time budget covers the whole round: reserve what the closing evaluation will cost.
        eval_cost = time.perf_counter() - started
        budget = self.config.time_budget_s
        deadline = None if budget is None else started + budget - eval_cost
        if self._frozen_score is None:
            self._frozen_score = self.score(self.frozen)
        losses, num_positions, train_time = self._train_steps(deadline)
        after = self.score(self.model) if losses else before
        margin = self.config.min_improvement
        improved = bool(losses) and after > before + margin and after >= self._frozen_score
        # Never keep serving a drafter that measures worse than the one training started from: a
        # string of small held-out wins can still drift below it, so the frozen copy competes too.
        reverted = not improved and self._frozen_score > max(before, after) + margin
        if improved:
            self._published = self._snapshot()
            self.version += 1
        elif reverted:
            self._published = self._snapshot(self.frozen)
            self.version += 1
            self._restore_published()
        else:
            self._restore_published()
        round_time = time.perf_counter() - started
        return LearnerReport(
            published=improved or reverted,
            reverted_to_frozen=reverted,
            version=self.version,
            acceptance_before=before,
            acceptance_after=after,
            acceptance_frozen_shadow=self._frozen_score,
            loss=sum(losses) / len(losses) if losses else math.nan,
            train_time_s=train_time,
            eval_time_s=round_time - train_time,
            round_time_s=round_time,
            num_positions=num_positions,
            num_steps=len(losses),
            num_holdout_positions=sum(e.num_positions for e in self.holdout),
            policy_version=self.holdout_version,
        )

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters of the published version, for `engine.update_drafter(sd, learner.version)`.

        The tensors are the learner's own snapshot: the engine copies them; do not modify them.
        """
        return self._published

    def save(self, path: str | os.PathLike) -> None:
        """Everything a resumed run needs: weights (published, frozen), optimizer, data, counters.

        Atomic (`checkpoint.save_checkpoint`): a crash mid-save leaves the previous checkpoint whole.
        """
        save_checkpoint({
            "config": asdict(self.config),
            "version": self.version,
            "published": self._published,
            "frozen": {n: p.detach().clone() for n, p in self.frozen.named_parameters()},
            "optimizer": self._optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "holdout": [dict(vars(e)) for e in self.holdout],
            "holdout_version": self.holdout_version,
            "num_seen_newest": self._num_seen_newest,
            "generator": self._generator.get_state(),
        }, path)

    @classmethod
    def load(cls, path: str | os.PathLike, drafter: torch.nn.Module) -> DraftLearner:
        """Resume from `save`; `drafter` only provides the architecture (its weights are replaced).

        An empty, truncated or foreign file, or one of another architecture, raises a `ValueError`
        naming `path`; `drafter` itself is never modified.
        """
        state = load_checkpoint(path, CHECKPOINT_KEYS)
        buffer = DraftBuffer()
        buffer.load_state_dict(state["buffer"])
        learner = cls(drafter, LearnerConfig(**state["config"]), buffer)
        copy_into(learner.frozen, state["frozen"], f"checkpoint {path}: the drafter")
        copy_into(learner.model, state["published"], f"checkpoint {path}: the drafter")
        learner._published = state["published"]
        learner._optimizer.load_state_dict(state["optimizer"])
        learner.version = state["version"]
        learner.holdout = [BufferedRollout(**e) for e in state["holdout"]]
        learner.holdout_version = state["holdout_version"]
        learner._num_seen_newest = state["num_seen_newest"]
        learner._generator.set_state(state["generator"])
        return learner

    # ------------------------------------------------------------------ internals

    def _next_is_holdout(self) -> bool:
        """Every 1/f-th prompt group of the newest version, starting with the first (exact fraction f)."""
        i, f = self._num_seen_newest, self.config.holdout_fraction
        self._num_seen_newest += 1
        return math.floor((i + 1) * f + 1 - f + 1e-9) > math.floor(i * f + 1 - f + 1e-9)

    def _train_steps(self, deadline: float | None) -> tuple[list[float], int, float]:
        cfg, losses, num_positions = self.config, [], 0
        if len(self.buffer) == 0:
            return losses, num_positions, 0.0
        started = time.perf_counter()
        self.model.train()
        loss_fn = LOSSES[cfg.loss]
        for _ in range(cfg.max_steps):
            if deadline is not None and time.perf_counter() >= deadline:
                break
            batch = self.buffer.sample(cfg.batch_size, self._generator).to(self.device)
            per_position = loss_fn(self._log_q(self.model, batch), batch.topk_ids, batch.topk_probs)  # [B, T]
            loss = (per_position * batch.weights).sum() / batch.weights.shape[0]
            self._optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            self._optimizer.step()
            losses.append(float(loss.detach()))
            num_positions += batch.num_positions
        self.model.eval()
        return losses, num_positions, time.perf_counter() - started

    @torch.inference_mode()
    def score(self, drafter: torch.nn.Module) -> float:
        """Expected acceptance of any drafter (same vocabulary) on the current held-out positions."""
        if not self.holdout:
            raise ValueError("no held-out rollouts yet: add_rollouts(...) before scoring")
        total, count = 0.0, 0.0
        size = self.config.eval_batch_size
        for start in range(0, len(self.holdout), size):
            batch = collate(self.holdout[start : start + size]).to(self.device)
            acc = expected_acceptance(self._log_q(drafter, batch), batch.topk_ids, batch.topk_probs)  # [B, T]
            total += float((acc * batch.weights).sum())
            count += float(batch.weights.sum())
        return total / count

    def _log_q(self, drafter: torch.nn.Module, batch: DraftBatch) -> torch.Tensor:
        """Drafter log-probs at each completion position, at the rollouts' temperature: [B, T, V]."""
        logits = drafter(input_ids=batch.input_ids).logits  # [B, L, V]
        index = batch.loss_index[..., None].expand(-1, -1, logits.shape[-1])  # [B, T, V]
        return (logits.gather(1, index).float() / self.config.temperature).log_softmax(-1)

    def _snapshot(self, model: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in (model or self.model).named_parameters()}

    @torch.no_grad()
    def _restore_published(self) -> None:
        for name, param in self.model.named_parameters():
            param.copy_(self._published[name])
        self._optimizer = self._make_optimizer()

    def _make_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        return torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
