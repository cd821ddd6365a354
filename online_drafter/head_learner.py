"""HeadLearner: trains an EAGLE-style head or Medusa heads on the policy's own features, publish-if-better.

Usage (the engine runs an "eagle" or "medusa" drafter with `record_signals=True`, so every rollout
carries the target's hidden states and top-k p; backends reach it as an `OnlineLearner`)::

    learner = HeadLearner(head, target.get_input_embeddings(), target.get_output_embeddings(), LearnerConfig())
    learner.add_rollouts(rollouts)
    report = learner.train_round(budget_s=..., break_even=...)   # while the trainer updates the policy
    if report.published:
        engine.update_drafter(learner.published_state_dict(), learner.version)
    probe = learner.probe(engine.generate(probe_prompts, params, n=2))   # fresh, never trained on

The decisions are `DraftLearner`'s, with the same `LearnerConfig` and the same reports: a private fp32
*candidate* trained teacher-forced (`head_objectives`, `head_scoring`) with the bucketed KL or TV to the
recorded top-k p, warmed up over `warmup_steps`, judged and published as its exponential average
(`ema_decay`); a stride of prompt groups held out across versions (`HoldoutSet`); a gate on the paired
gain over the published head (`paired`), reserved from the round's budget and taken only once the
candidate trained as long as scoring costs; a reset past `reset_margin`; the *frozen* shadow (the head
as given) scored on the same positions; a watchdog (served below frozen, or below break-even) and a
probe that revert to the best known head (`decisions`). The embedding and LM head are the policy's,
read live and never trained: on the policy's side a sync updates them in place.

Memory: `FeatureBuffer` (bytes per position there) bounds the training sequences by
`buffer.max_positions`, `max_holdout_positions` the held-out ones.

Layer-skip self-speculation has nothing to train: its draft is the policy itself, truncated.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable

import torch
from torch import nn

from specroll.rollout import Rollout

from .decisions import best_known, smoothed, watchdog_reason
from .divergence import LOSSES
from .head_buffer import FeatureBuffer
from .head_data import FeatureSequence, collate, from_rollout
from .head_objectives import objective_for
from .head_scoring import HeadScorer
from .holdout import GroupKey, HoldoutSet
from .learner_config import LearnerConfig
from .paired import GroupScores, paired_gain
from .reports import LearnerReport, ProbeReport


class HeadLearner:
    """Online head distillation with the paired gate, frozen shadow and watchdog (see module doc)."""

    def __init__(self, head: nn.Module, embed: nn.Module, lm_head: nn.Module, config: LearnerConfig | None = None):
        self.config = config = config or LearnerConfig()
        self.device = torch.device(config.device)
        self.model = copy.deepcopy(head).to(self.device, torch.float32).train().requires_grad_(True)
        self.averaged = copy.deepcopy(self.model).eval().requires_grad_(False)  # judged and published
        self.published = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.frozen = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.scorer = HeadScorer(objective_for(head, embed, lm_head), config.temperature, config.eval_batch_size,
                                 config.holdout_recency_decay, self.device)
        self.buffer = FeatureBuffer(config.buffer)
        self.holdout = HoldoutSet(config.holdout_fraction, config.max_holdout_positions)
        self.version = 0
        self.newest_policy_version = -1
        self._published_weights = _weights(self.published)
        self._optimizer = self._make_optimizer()
        self._generator = torch.Generator().manual_seed(config.seed)
        # Per-entry held-out scores of the published and frozen heads, aligned with the held-out set's
        # first entries: only entries added since are scored again.
        self._entry_scores: dict[str, torch.Tensor] = {}
        self._scoring_s_per_entry = 0.0
        self._step_s = 0.0
        self._trained_since_gate_s = 0.0
        self._candidate_changed = False

    # ------------------------------------------------------------------ public API

    def add_rollouts(self, rollouts: list[Rollout]) -> None:
        """`add` the rollouts' recorded features (`head_data.from_rollout`; empty completions skipped)."""
        self.add(from_rollout(r) for r in rollouts if r.completion_ids)

    def add(self, sequences: Iterable[FeatureSequence]) -> None:
        """Buffer feature sequences (online: from rollouts; offline: `head_data.from_target`), holding a
        stride of prompt groups out."""
        for seq in sequences:
            if not self.holdout.offer(seq, _key(seq)):
                self.buffer.add([seq])
            self.newest_policy_version = max(self.newest_policy_version, seq.policy_version)
        dropped = self.holdout.trim(self._oldest_weighed_version())
        self.buffer.add(dropped)
        for name, scores in self._entry_scores.items():
            self._entry_scores[name] = scores[len(dropped):]

    def train_round(self, budget_s: float | None = None, break_even: float | None = None) -> LearnerReport:
        """Train the candidate within the budget (with `config.time_budget_s`, whichever is smaller), gate
        it against the published head, run the watchdog (`break_even`: the γ policy's acceptance floor)."""
        if not self.holdout:
            raise ValueError("no held-out rollouts yet: add_rollouts(...) before train_round()")
        started = time.perf_counter()
        budgets = [b for b in (budget_s, self.config.time_budget_s) if b is not None]
        budget = min(budgets) if budgets else None
        unscored = sum(len(self.holdout) - len(self._entry_scores.get(n, ())) for n in ("published", "frozen"))
        eval_cost = 1.2 * self._scoring_s_per_entry * (len(self.holdout) + unscored)
        gate = budget is None or (budget >= eval_cost and self._trained_since_gate_s + budget - eval_cost >= eval_cost)
        deadline = None if budget is None else started + budget - (eval_cost if gate else 0.0)
        losses, num_positions, train_time = self._train_steps(deadline)
        self._trained_since_gate_s += train_time
        self._candidate_changed = self._candidate_changed or bool(losses)
        gate = gate and self._candidate_changed
        report = dict(loss=sum(losses) / len(losses) if losses else math.nan, train_time_s=train_time,
                      budget_s=budget, num_positions=num_positions, num_steps=len(losses),
                      policy_version=self.newest_policy_version, gated=gate)
        if not gate:
            nan = math.nan
            return LearnerReport(False, self.version, nan, nan, nan, nan, nan, eval_time_s=0.0,
                                 round_time_s=time.perf_counter() - started,
                                 num_holdout_positions=sum(e.num_positions for e in self.holdout.entries),
                                 num_holdout_groups=len(set(self.holdout.keys)), **report)
        scored = time.perf_counter()
        published, frozen = self._cached("published"), self._cached("frozen")
        candidate_entries = self.scorer.score_entries(self.averaged, self.holdout.entries)
        self._scoring_s_per_entry = smoothed(self._scoring_s_per_entry,
                                             (time.perf_counter() - scored) / (len(self.holdout) + unscored))
        self._trained_since_gate_s, self._candidate_changed = 0.0, False
        candidate = self._group(candidate_entries)
        gain = paired_gain(candidate, published)
        z, event = self.config.gate_z, None
        publish = gain.above(z, self.config.min_improvement)
        if publish:
            self._publish(self.averaged, candidate_entries)
        elif gain.below(z, self.config.reset_margin):
            self._load_candidate(self.published)
            event = f"candidate reset to version {self.version}: it scored {gain.mean:+.4f} ± {gain.se:.4f} below it"
        served = self._cached("published")
        reason = watchdog_reason(served, frozen, self.version, self.config, break_even, "held-out")
        if reason is not None:
            event = self._revert(reason, {"frozen": frozen, "served": served, "candidate": candidate},
                                 candidate_entries)
        return LearnerReport(publish or reason is not None, self.version, published.mean, candidate.mean,
                             frozen.mean, gain.mean, gain.se, eval_time_s=time.perf_counter() - scored,
                             round_time_s=time.perf_counter() - started,
                             num_holdout_positions=published.num_positions,
                             num_holdout_groups=int(published.counts.shape[0]), event=event, **report)

    def probe(self, rollouts: list[Rollout]) -> ProbeReport:
        """Score the served and the frozen head on probe rollouts (not buffered); revert if served lost."""
        started = time.perf_counter()
        entries = [from_rollout(r) for r in rollouts if r.completion_ids]
        keys = [_key(e) for e in entries]
        served = self.scorer.group(self.scorer.score_entries(self.published, entries), keys)
        frozen = self.scorer.group(self.scorer.score_entries(self.frozen, entries), keys)
        gain = paired_gain(served, frozen)
        version, event = self.version, None
        reason = watchdog_reason(served, frozen, version, self.config, None, "the probe")
        if reason is not None:
            event = self._revert(reason, {"frozen": frozen, "served": served})
        return ProbeReport(served.mean, frozen.mean, gain.mean, gain.se, served.se, frozen.se, served.num_positions,
                           int(served.counts.shape[0]), max(e.policy_version for e in entries), version, event,
                           time.perf_counter() - started)

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters of the published version (the learner's snapshot: the engine copies them)."""
        return self._published_weights

    # ------------------------------------------------------------------ decisions

    def _revert(self, reason: str, known: dict[str, GroupScores], candidate_entries: torch.Tensor | None = None) -> str:
        """Publish the best of the `known` heads ("frozen", "served", "candidate") by their scores."""
        best = best_known(known)
        if best == "served":
            return f"{reason}; kept it: no known head scores higher"
        if best == "frozen":
            self._publish(self.frozen, self._entry_scores.get("frozen"))
            self._load_candidate(self.frozen)
        else:
            self._publish(self.averaged, candidate_entries)
        return f"{reason}; reverted to the {best} head as version {self.version}"

    @torch.no_grad()
    def _publish(self, head: nn.Module, held_out_entry_scores: torch.Tensor | None) -> None:
        """Serve `head`'s weights as the next version; its per-entry held-out scores, if known, spare a rescoring."""
        self.published.load_state_dict(head.state_dict())
        self._published_weights = _weights(self.published)
        self.version += 1
        if held_out_entry_scores is None:
            self._entry_scores.pop("published", None)
        else:
            self._entry_scores["published"] = held_out_entry_scores.clone()

    # ------------------------------------------------------------------ internals

    def _train_steps(self, deadline: float | None) -> tuple[list[float], int, float]:
        cfg, losses, num_positions = self.config, [], 0
        if len(self.buffer) == 0:
            return losses, num_positions, 0.0
        started = time.perf_counter()
        self.model.train()
        loss_fn = LOSSES[cfg.loss]
        for step in range(cfg.max_steps):
            # Stop before a step that would end past the deadline, by the mean step so far (or the last round's).
            per_step = (time.perf_counter() - started) / step if step else self._step_s
            if deadline is not None and time.perf_counter() + per_step >= deadline:
                break
            batch = collate(self.buffer.sample(cfg.batch_size, self._generator)).to(self.device)
            loss = self.scorer.loss(self.model, batch, loss_fn)
            self._optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self._warm_up()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            self._optimizer.step()
            self._average()
            losses.append(float(loss.detach()))
            num_positions += int(batch.weights.sum())
        self.model.eval()
        if losses:
            self._step_s = smoothed(self._step_s, (time.perf_counter() - started) / len(losses))
        return losses, num_positions, time.perf_counter() - started

    def _oldest_weighed_version(self) -> int | None:
        """The oldest policy version whose held-out groups still weigh `holdout_min_weight` or more."""
        decay, floor = self.config.holdout_recency_decay, self.config.holdout_min_weight
        if decay >= 1 or floor <= 0:
            return None
        return self.newest_policy_version - math.floor(math.log(floor) / math.log(decay) + 1e-9)

    def _cached(self, name: str) -> GroupScores:
        """The published or frozen head's held-out scores, scoring only entries not scored before."""
        known = self._entry_scores.get(name, torch.zeros(0, 2, dtype=torch.float64))
        missing = self.holdout.entries[len(known):]
        if missing:
            known = torch.cat([known, self.scorer.score_entries(getattr(self, name), missing)])
            self._entry_scores[name] = known
        return self._group(known)

    def _group(self, per_entry: torch.Tensor) -> GroupScores:
        return self.scorer.group(per_entry, self.holdout.keys)

    @torch.no_grad()
    def _load_candidate(self, head: nn.Module) -> None:
        """Restart the candidate from `head`'s weights with a fresh optimizer."""
        for model in (self.model, self.averaged):
            model.load_state_dict(head.state_dict())
        self._optimizer = self._make_optimizer()

    def _make_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        return torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    @torch.no_grad()
    def _average(self) -> None:
        for average, param in zip(self.averaged.parameters(), self.model.parameters()):
            average.lerp_(param.detach(), 1.0 - self.config.ema_decay)

    def _warm_up(self) -> None:
        """Linear lr warmup over a fresh optimizer's first `warmup_steps` steps (why: `DraftLearner._warm_up`)."""
        done = max((int(s["step"]) for s in self._optimizer.state.values() if "step" in s), default=0)
        steps = self.config.warmup_steps
        scale = min(1.0, (done + 1) / steps) if steps else 1.0
        for group in self._optimizer.param_groups:
            group["lr"] = self.config.lr * scale


def _key(seq: FeatureSequence) -> GroupKey:
    return seq.policy_version, tuple(seq.token_ids[: seq.prompt_len].tolist())


def _weights(head: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in head.named_parameters()}
