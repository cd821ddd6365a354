"""DraftLearner: distils the drafter toward the moving policy between RL steps, publish-if-better.

Usage (the loop DESIGN.md draws; `engine` is a `SpecEngine` with `record_signals=True`)::

    learner = DraftLearner(drafter, LearnerConfig(max_steps=50))
    for step in range(num_steps):
        rollouts = engine.generate(prompts, params)        # signals come with verification
        learner.add_rollouts(rollouts)
        report = learner.train_round(budget_s=...)          # while the trainer updates the policy
        if report.published:
            engine.update_drafter(learner.published_state_dict(), learner.version)
        probe = learner.probe(engine.generate(probe_prompts, params, n=2))   # fresh, never trained on

The learner trains a private fp32 copy of the drafter — the *candidate* — teacher-forced on buffered
contexts, with the bucketed forward KL (or TV) to the target's recorded top-k (`divergence.py`). It
never holds the target: everything it knows of p is the recorded top-k, so no gradient reaches the policy.

Decisions are paired comparisons on the same positions with a group-clustered interval (`paired.py`):

- **Held-out set.** A stride of every policy version's prompt groups is held out and kept across
  versions (bounded by `max_holdout_positions`, oldest groups go to training), so the interval
  narrows as the run goes instead of resting on one step's few groups.
- **Gate.** The candidate is published only if its gain over the published drafter on the held-out
  set clears `gate_z` standard errors (plus `min_improvement`). A rejected candidate keeps its weights
  and optimizer, so small gains accumulate over rounds; one that falls below the published drafter
  beyond the interval is reset to it (a diverging run does not dig deeper).
- **Watchdog.** If the served (published) drafter scores below the frozen step-0 drafter beyond the
  interval — on the held-out set each round, or on a probe — or below the break-even acceptance the
  engine's γ policy computes, the learner publishes the best drafter it knows (frozen, served or
  candidate, by held-out score) as a new version and reports the event.
- **Frozen shadow.** The initial drafter, scored on the same positions: what no online learning
  would give. `probe` scores served and frozen on rollouts of a fixed probe set of prompts, fresh at
  each policy version — the honest drift measure; held-out numbers move with the prompts a step drew.
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
from .paired import GroupScores, paired_gain

CHECKPOINT_KEYS = ("config", "version", "published", "frozen", "candidate", "optimizer", "buffer", "holdout",
                   "holdout_keys", "num_groups_seen", "generator")


@dataclass
class LearnerConfig:
    """Per-round budget (`max_steps`, optional `time_budget_s` for the whole round, evaluation
    included; a caller may pass a smaller budget per round), AdamW settings, the held-out set and the gate.

    `lr` 1e-4: on the demo, 1e-3 on the few hundred new positions a step yields made every candidate
    worse than the frozen drafter, 1e-4 gained. A held-out group of policy version v weighs
    `holdout_recency_decay ** (newest − v)` in every comparison. `gate_z`: standard errors a
    candidate's paired gain must clear to be published, and the served drafter's loss to the frozen
    one must exceed, by `watchdog_margin` more, for the watchdog to revert (1.64: one-sided 5%).
    `temperature` must be the rollouts' sampling temperature
    (1.0 for greedy rollouts, whose signals are the T = 1 distribution): q is the drafter's softmax at
    that temperature, as the engine does.
    """

    lr: float = 1e-4
    weight_decay: float = 0.0
    batch_size: int = 16
    max_steps: int = 50
    time_budget_s: float | None = None
    loss: str = "kl"
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    holdout_fraction: float = 0.2
    max_holdout_positions: int = 20_000
    holdout_recency_decay: float = 0.5
    gate_z: float = 1.64
    watchdog_margin: float = 0.005
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
            ("holdout_recency_decay", 0 < self.holdout_recency_decay <= 1, "a number in (0, 1]"),
            ("gate_z", self.gate_z >= 0, "a number >= 0"),
            ("watchdog_margin", self.watchdog_margin >= 0, "a number >= 0"),
            ("min_improvement", self.min_improvement >= 0, "a number >= 0"),
            ("eval_batch_size", isinstance(self.eval_batch_size, int) and self.eval_batch_size >= 1,
             "an int >= 1"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: {allowed}")


@dataclass
class LearnerReport:
    """One round. Acceptances are expected acceptance Σ min(p, q) on the held-out positions (every
    version's held-out groups): the published drafter before the round, the candidate after it, the
    frozen shadow; `gain` ± `gain_se` is candidate − published, paired."""

    published: bool
    version: int  # drafter version after the round (moved if published or reverted)
    acceptance_before: float
    acceptance_after: float
    acceptance_frozen_shadow: float
    gain: float
    gain_se: float
    loss: float  # mean training loss over the round's steps (nan without steps)
    train_time_s: float  # optimizer steps
    eval_time_s: float  # held-out scoring
    round_time_s: float  # the whole round
    budget_s: float | None  # the time the round was given (None: steps only)
    num_positions: int  # completion positions trained on (with repetition)
    num_steps: int
    num_holdout_positions: int
    num_holdout_groups: int
    policy_version: int  # the newest policy version the learner has seen
    event: str | None = None  # the watchdog's, or a candidate reset: what happened and why


@dataclass
class ProbeReport:
    """Served and frozen drafters on a probe batch (fresh rollouts of fixed prompts, never trained on)."""

    served: float
    frozen: float
    gain: float  # served − frozen, paired by prompt group
    gain_se: float
    num_positions: int
    num_groups: int
    policy_version: int
    drafter_version: int  # the version scored (before any revert this probe caused)
    event: str | None = None


class DraftLearner:
    """Online drafter distillation with a paired publish gate and a watchdog (see module doc)."""

    def __init__(self, drafter: torch.nn.Module, config: LearnerConfig | None = None,
                 buffer: DraftBuffer | None = None):
        self.config = config = config or LearnerConfig()
        self.device = torch.device(config.device)
        self.model = copy.deepcopy(drafter).to(self.device, torch.float32)
        self.frozen = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.buffer = buffer if buffer is not None else DraftBuffer()
        self.holdout: list[BufferedRollout] = []
        self.holdout_keys: list[tuple[int, tuple[int, ...]]] = []  # (policy version, prompt) per entry
        self.version = 0
        self.newest_policy_version = -1
        self._published = self._snapshot()
        self._optimizer = self._make_optimizer()
        self._generator = torch.Generator().manual_seed(config.seed)
        self._num_groups_seen = 0
        self._group_is_holdout: dict[tuple[int, tuple[int, ...]], bool] = {}
        self._cache: dict[str, GroupScores] = {}  # published / frozen scores until the held-out set changes

    # ------------------------------------------------------------------ public API

    def add_rollouts(self, rollouts: list[Rollout]) -> None:
        """Buffer rollouts (generated with `record_signals=True`), holding a stride of prompt groups out."""
        for rollout in rollouts:
            entry = to_buffered(rollout)
            # Whole prompt groups are held out together: a sibling of a training rollout shares its
            # prompt and much of its text, so splitting a group would score the drafter on what it saw.
            key = (entry.policy_version, tuple(rollout.prompt_ids))
            if key not in self._group_is_holdout:
                self._group_is_holdout[key] = self._next_is_holdout()
            if self._group_is_holdout[key]:
                self.holdout.append(entry)
                self.holdout_keys.append(key)
            else:
                self.buffer.add([entry])
            self.newest_policy_version = max(self.newest_policy_version, entry.policy_version)
        while sum(e.num_positions for e in self.holdout) > self.config.max_holdout_positions:
            oldest = self.holdout_keys[0]
            while self.holdout_keys and self.holdout_keys[0] == oldest:  # a whole group at a time
                self.holdout_keys.pop(0)
                self.buffer.add([self.holdout.pop(0)])
        self._cache.clear()

    def train_round(self, budget_s: float | None = None, break_even: float | None = None) -> LearnerReport:
        """Train the candidate within the budget, gate it against the published drafter, run the watchdog.

        `budget_s` caps this round (with `config.time_budget_s`, whichever is smaller), evaluation
        included; `break_even` is the acceptance below which speculation stops paying (from the γ
        policy), for the watchdog.
        """
        if not self.holdout:
            raise ValueError("no held-out rollouts yet: add_rollouts(...) before train_round()")
        started = time.perf_counter()
        budgets = [b for b in (budget_s, self.config.time_budget_s) if b is not None]
        budget = min(budgets) if budgets else None
        published, frozen = self._cached("published"), self._cached("frozen")
        eval_cost = 2 * (time.perf_counter() - started) + 1e-3  # the candidate's scoring, with margin
        deadline = None if budget is None else started + budget - eval_cost
        losses, num_positions, train_time = self._train_steps(deadline)
        scored = time.perf_counter()
        candidate = self._score_groups(self.model, self.holdout, self.holdout_keys) if losses else published
        gain = paired_gain(candidate, published)
        z, event = self.config.gate_z, None
        publish = bool(losses) and gain.above(z, self.config.min_improvement)
        if publish:
            self._publish(self._snapshot(), candidate)
        elif gain.below(z):
            self._load_candidate(self._published)
            event = f"candidate reset to version {self.version}: it scored {gain.mean:+.4f} ± {gain.se:.4f} below it"
        watchdog = self._watchdog(self._cached("published"), frozen, candidate, break_even)
        return LearnerReport(
            published=publish or watchdog is not None,
            version=self.version,
            acceptance_before=published.mean,
            acceptance_after=candidate.mean,
            acceptance_frozen_shadow=frozen.mean,
            gain=gain.mean,
            gain_se=gain.se,
            loss=sum(losses) / len(losses) if losses else math.nan,
            train_time_s=train_time,
            eval_time_s=(scored - started - train_time) + (time.perf_counter() - scored),
            round_time_s=time.perf_counter() - started,
            budget_s=budget,
            num_positions=num_positions,
            num_steps=len(losses),
            num_holdout_positions=published.num_positions,
            num_holdout_groups=int(published.counts.shape[0]),
            policy_version=self.newest_policy_version,
            event=watchdog or event,
        )

    @torch.inference_mode()
    def probe(self, rollouts: list[Rollout]) -> ProbeReport:
        """Score the served and the frozen drafter on probe rollouts (not buffered); revert if served lost.

        The rollouts should be fresh samples of a fixed set of prompts at the current policy version,
        generated with `record_signals=True`, and never given to `add_rollouts`.
        """
        entries = [to_buffered(r) for r in rollouts]
        keys = [(e.policy_version, tuple(r.prompt_ids)) for e, r in zip(entries, rollouts)]
        served = self._score_groups(self._published_model(), entries, keys)
        frozen = self._score_groups(self.frozen, entries, keys)
        gain = paired_gain(served, frozen)
        version = self.version
        event = None
        if gain.below(self.config.gate_z, self.config.watchdog_margin):
            event = self._revert(f"probe: served version {version} scored {gain.mean:+.4f} ± {gain.se:.4f} "
                                 "below the frozen drafter", {"frozen": frozen, "served": served})
        return ProbeReport(served.mean, frozen.mean, gain.mean, gain.se, served.num_positions,
                           int(served.counts.shape[0]), max(e.policy_version for e in entries), version, event)

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters of the published version, for `engine.update_drafter(sd, learner.version)`.

        The tensors are the learner's own snapshot: the engine copies them; do not modify them.
        """
        return self._published

    def score(self, drafter: torch.nn.Module) -> float:
        """Expected acceptance of any drafter (same vocabulary) on the current held-out positions."""
        if not self.holdout:
            raise ValueError("no held-out rollouts yet: add_rollouts(...) before scoring")
        return self._score_groups(drafter, self.holdout, self.holdout_keys).mean

    def save(self, path: str | os.PathLike) -> None:
        """Everything a resumed run needs: weights (published, frozen, candidate), optimizer, data, counters.

        Atomic (`checkpoint.save_checkpoint`): a crash mid-save leaves the previous checkpoint whole.
        """
        save_checkpoint({
            "config": asdict(self.config),
            "version": self.version,
            "published": self._published,
            "frozen": self._snapshot(self.frozen),
            "candidate": self._snapshot(),
            "optimizer": self._optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "holdout": [dict(vars(e)) for e in self.holdout],
            "holdout_keys": [[v, list(prompt)] for v, prompt in self.holdout_keys],
            "num_groups_seen": self._num_groups_seen,
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
        copy_into(learner.model, state["candidate"], f"checkpoint {path}: the drafter")
        copy_into(copy.deepcopy(learner.model), state["published"], f"checkpoint {path}: the drafter")
        learner._published = state["published"]
        learner._optimizer.load_state_dict(state["optimizer"])
        learner.version = state["version"]
        learner.holdout = [BufferedRollout(**e) for e in state["holdout"]]
        learner.holdout_keys = [(int(v), tuple(prompt)) for v, prompt in state["holdout_keys"]]
        learner._group_is_holdout = dict.fromkeys(learner.holdout_keys, True)
        learner.newest_policy_version = max([e.policy_version for e in learner.holdout]
                                            + [max(buffer.versions, default=-1)])
        learner._num_groups_seen = state["num_groups_seen"]
        learner._generator.set_state(state["generator"])
        return learner

    # ------------------------------------------------------------------ decisions

    def _watchdog(self, served: GroupScores, frozen: GroupScores, candidate: GroupScores,
                  break_even: float | None) -> str | None:
        """Revert when the served drafter lost to the frozen one beyond the interval, or to break-even."""
        versus_frozen = paired_gain(served, frozen)
        known = {"frozen": frozen, "served": served, "candidate": candidate}
        if versus_frozen.below(self.config.gate_z, self.config.watchdog_margin):
            return self._revert(f"served version {self.version} scored {versus_frozen.mean:+.4f} ± "
                                f"{versus_frozen.se:.4f} below the frozen drafter on held-out", known)
        if break_even is not None and served.mean < break_even:
            return self._revert(f"served version {self.version} scored {served.mean:.4f}, below the γ policy's "
                                f"break-even acceptance {break_even:.4f}", known)
        return None

    def _revert(self, reason: str, known: dict[str, GroupScores]) -> str:
        """Publish the best of the `known` drafters ("frozen", "served", "candidate") by their scores."""
        best = max(known, key=lambda name: known[name].mean)
        if best == "served":
            return f"{reason}; kept it: no known drafter scores higher"
        weights = self._snapshot(self.frozen) if best == "frozen" else self._snapshot()
        self._published = weights
        self.version += 1
        self._cache.pop("published", None)
        if best == "frozen":
            self._load_candidate(weights)
        return f"{reason}; reverted to the {best} drafter as version {self.version}"

    def _publish(self, weights: dict[str, torch.Tensor], scores: GroupScores) -> None:
        self._published = weights
        self.version += 1
        self._cache["published"] = scores

    # ------------------------------------------------------------------ internals

    def _next_is_holdout(self) -> bool:
        """Every 1/f-th prompt group, starting with the first (an exact fraction f over the run)."""
        i, f = self._num_groups_seen, self.config.holdout_fraction
        self._num_groups_seen += 1
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

    def _cached(self, name: str) -> GroupScores:
        if name not in self._cache:
            model = self.frozen if name == "frozen" else self._published_model()
            self._cache[name] = self._score_groups(model, self.holdout, self.holdout_keys)
        return self._cache[name]

    def _published_model(self) -> torch.nn.Module:
        """The published weights in a module: the candidate itself when it is what was published."""
        candidate = dict(self.model.named_parameters())
        if all(torch.equal(candidate[n], t) for n, t in self._published.items()):
            return self.model
        model = copy.deepcopy(self.frozen)
        copy_into(model, self._published, "published drafter")
        return model

    @torch.inference_mode()
    def _score_groups(self, drafter: torch.nn.Module, entries: list[BufferedRollout],
                      keys: list[tuple[int, tuple[int, ...]]]) -> GroupScores:
        """Expected acceptance sums and position counts per group (groups in order of first appearance)."""
        index: dict[tuple[int, tuple[int, ...]], int] = {}
        group_of = torch.tensor([index.setdefault(k, len(index)) for k in keys])  # [N]
        per_entry = torch.zeros(len(entries), 2, dtype=torch.float64)  # [N, (sum, count)]
        size = self.config.eval_batch_size
        for start in range(0, len(entries), size):
            batch = collate(entries[start : start + size]).to(self.device)
            acc = expected_acceptance(self._log_q(drafter, batch), batch.topk_ids, batch.topk_probs)  # [B, T]
            per_entry[start : start + size, 0] = (acc * batch.weights).sum(1).double().cpu()
            per_entry[start : start + size, 1] = batch.weights.sum(1).double().cpu()
        groups = torch.zeros(len(index), 2, dtype=torch.float64).index_add_(0, group_of, per_entry)
        newest = max(version for version, _ in index)
        weights = torch.tensor([self.config.holdout_recency_decay ** (newest - version) for version, _ in index],
                               dtype=torch.float64)
        return GroupScores(groups[:, 0], groups[:, 1], weights)

    def _log_q(self, drafter: torch.nn.Module, batch: DraftBatch) -> torch.Tensor:
        """Drafter log-probs at each completion position, at the rollouts' temperature: [B, T, V]."""
        logits = drafter(input_ids=batch.input_ids).logits  # [B, L, V]
        index = batch.loss_index[..., None].expand(-1, -1, logits.shape[-1])  # [B, T, V]
        return (logits.gather(1, index).float() / self.config.temperature).log_softmax(-1)

    def _snapshot(self, model: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in (model or self.model).named_parameters()}

    @torch.no_grad()
    def _load_candidate(self, weights: dict[str, torch.Tensor]) -> None:
        """Restart the candidate from `weights` with a fresh optimizer."""
        for name, param in self.model.named_parameters():
            param.copy_(weights[name])
        self._optimizer = self._make_optimizer()

    def _make_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        return torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
