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
What is judged and published is an exponential average of the trained weights (`ema_decay`): on a
drafter already close to the policy, single lr-1e-3 steps are mostly noise, their average is not.

Decisions are paired comparisons on the same positions with a group-clustered interval (`paired.py`):

- **Held-out set.** A stride of every policy version's prompt groups is held out and kept across
  versions (bounded by `max_holdout_positions`, oldest groups go to training), so the interval
  narrows as the run goes instead of resting on one step's few groups.
- **Gate.** The candidate is published only if its gain over the published drafter on the held-out
  set clears `gate_z` standard errors (plus `min_improvement`). A rejected candidate keeps its weights
  and optimizer, so small gains accumulate over rounds; one that falls more than `reset_margin`
  below the published drafter beyond the interval is reset to it (a diverging run does not dig deeper).
  A round gates only once the candidate has trained at least as long as the gate's scoring costs;
  until then it only trains (its report has `gated` False and nan scores).
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

import torch

from specroll.rollout import Rollout
from specroll.rollout.weights import copy_into

from .buffer import DraftBuffer, to_buffered
from .checkpoint import load_checkpoint, save_checkpoint
from .divergence import LOSSES
from .holdout import HoldoutSet
from .learner_config import LearnerConfig
from .learner_state import CHECKPOINT_KEYS, restore, state_of
from .paired import GroupScores, paired_gain
from .reports import LearnerReport, ProbeReport
from .scoring import DrafterScorer

# Batches drawn at once, then grouped by length: more groups tighter lengths, but a draw is only taken
# from the data buffered when it is made (a round takes ~5-20 steps on the demo).
_BATCHES_PER_DRAW = 4


class DraftLearner:
    """Online drafter distillation with a paired publish gate and a watchdog (see module doc)."""

    def __init__(self, drafter: torch.nn.Module, config: LearnerConfig | None = None,
                 buffer: DraftBuffer | None = None):
        self.config = config = config or LearnerConfig()
        self.device = torch.device(config.device)
        self.model = copy.deepcopy(drafter).to(self.device, torch.float32)
        self.frozen = copy.deepcopy(self.model).eval().requires_grad_(False)
        # The candidate that is judged and published: an exponential average of the trained weights
        # (`ema_decay`; the trained weights themselves when 0), so one noisy step does not decide.
        self.averaged = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.buffer = buffer if buffer is not None else DraftBuffer(config.buffer)
        self.holdout = HoldoutSet(config.holdout_fraction, config.max_holdout_positions)
        self.scorer = DrafterScorer(config.temperature, config.eval_batch_size, config.holdout_recency_decay,
                                    self.device)
        self.version = 0
        self.newest_policy_version = -1
        self._published = self._snapshot()
        self._optimizer = self._make_optimizer()
        self._generator = torch.Generator().manual_seed(config.seed)
        # Per-entry held-out scores of the published and the frozen drafter, aligned with the first
        # entries of the held-out set: only entries added since are scored again (frozen never changes,
        # published only when a round publishes, and then the candidate's scores are at hand).
        self._entry_scores: dict[str, torch.Tensor] = {}
        self._scoring_s_per_entry = 0.0  # the last gate's scoring, per entry scored
        self._step_s = 0.0  # the last round's mean optimizer step
        self._trained_since_gate_s = 0.0  # candidate training since it was last scored
        self._candidate_changed = False  # trained since it was last scored

    # ------------------------------------------------------------------ public API

    def add_rollouts(self, rollouts: list[Rollout]) -> None:
        """Buffer rollouts (generated with `record_signals=True`), holding a stride of prompt groups out."""
        for rollout in rollouts:
            entry = to_buffered(rollout)
            if not self.holdout.offer(entry, (entry.policy_version, tuple(rollout.prompt_ids))):
                self.buffer.add([entry])
            self.newest_policy_version = max(self.newest_policy_version, entry.policy_version)
        dropped = self.holdout.trim(self._oldest_weighed_version())
        self.buffer.add(dropped)
        for name, scores in self._entry_scores.items():
            self._entry_scores[name] = scores[len(dropped):]

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
        # A gate scores the candidate on every held-out entry and the published and frozen drafters on
        # the entries they have not seen; it is reserved (with a margin) from the round's budget, and
        # taken only once the candidate has trained at least as long as a gate costs (on short budgets
        # scoring every round would leave no time to train) and only within the budget. A round that
        # does not gate only trains.
        unscored = sum(len(self.holdout) - len(self._entry_scores.get(n, ())) for n in ("published", "frozen"))
        eval_cost = 1.2 * self._scoring_s_per_entry * (len(self.holdout) + unscored)
        gate = budget is None or (budget >= eval_cost and self._trained_since_gate_s + budget - eval_cost >= eval_cost)
        deadline = None if budget is None else started + budget - (eval_cost if gate else 0.0)
        losses, num_positions, train_time = self._train_steps(deadline)
        self._trained_since_gate_s += train_time
        self._candidate_changed = self._candidate_changed or bool(losses)
        gate = gate and self._candidate_changed
        report = dict(published=False, version=self.version, loss=sum(losses) / len(losses) if losses else math.nan,
                      train_time_s=train_time, budget_s=budget, num_positions=num_positions, num_steps=len(losses),
                      policy_version=self.newest_policy_version, gated=gate)
        if not gate:
            nan = math.nan
            return LearnerReport(acceptance_before=nan, acceptance_after=nan, acceptance_frozen_shadow=nan, gain=nan,
                                 gain_se=nan, eval_time_s=0.0, round_time_s=time.perf_counter() - started,
                                 num_holdout_positions=sum(e.num_positions for e in self.holdout.entries),
                                 num_holdout_groups=len(set(self.holdout.keys)), **report)
        scored = time.perf_counter()
        published, frozen = self._cached("published"), self._cached("frozen")
        candidate_entries = self.scorer.score_entries(self.averaged, self.holdout.entries)
        self._scoring_s_per_entry = _smoothed(self._scoring_s_per_entry,
                                              (time.perf_counter() - scored) / (len(self.holdout) + unscored))
        self._trained_since_gate_s, self._candidate_changed = 0.0, False
        candidate = self._group(candidate_entries)
        gain = paired_gain(candidate, published)
        z, event = self.config.gate_z, None
        publish = gain.above(z, self.config.min_improvement)
        if publish:
            self._publish(self._snapshot(self.averaged), candidate_entries)
        elif gain.below(z, self.config.reset_margin):
            self._load_candidate(self._published)
            event = f"candidate reset to version {self.version}: it scored {gain.mean:+.4f} ± {gain.se:.4f} below it"
        watchdog = self._watchdog(self._cached("published"), frozen, candidate, candidate_entries, break_even)
        report.update(published=publish or watchdog is not None, version=self.version)
        return LearnerReport(
            acceptance_before=published.mean,
            acceptance_after=candidate.mean,
            acceptance_frozen_shadow=frozen.mean,
            gain=gain.mean,
            gain_se=gain.se,
            eval_time_s=time.perf_counter() - scored,
            round_time_s=time.perf_counter() - started,
            num_holdout_positions=published.num_positions,
            num_holdout_groups=int(published.counts.shape[0]),
            event=watchdog or event,
            **report,
        )

    @torch.inference_mode()
    def probe(self, rollouts: list[Rollout]) -> ProbeReport:
        """Score the served and the frozen drafter on probe rollouts (not buffered); revert if served lost.

        The rollouts should be fresh samples of a fixed set of prompts at the current policy version,
        generated with `record_signals=True`, and never given to `add_rollouts`.
        """
        started = time.perf_counter()
        entries = [to_buffered(r) for r in rollouts]
        keys = [(e.policy_version, tuple(r.prompt_ids)) for e, r in zip(entries, rollouts)]
        served = self.scorer.score_groups(self._published_model(), entries, keys)
        frozen = self.scorer.score_groups(self.frozen, entries, keys)
        gain = paired_gain(served, frozen)
        version = self.version
        event = None
        if gain.below(self.config.gate_z, self.config.watchdog_margin):
            event = self._revert(f"probe: served version {version} scored {gain.mean:+.4f} ± {gain.se:.4f} "
                                 "below the frozen drafter", {"frozen": frozen, "served": served})
        return ProbeReport(served.mean, frozen.mean, gain.mean, gain.se, served.se, frozen.se, served.num_positions,
                           int(served.counts.shape[0]), max(e.policy_version for e in entries), version, event,
                           time.perf_counter() - started)

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters of the published version, for `engine.update_drafter(sd, learner.version)`.

        The tensors are the learner's own snapshot: the engine copies them; do not modify them.
        """
        return self._published

    def score(self, drafter: torch.nn.Module) -> float:
        """Expected acceptance of any drafter (same vocabulary) on the current held-out positions."""
        if not self.holdout:
            raise ValueError("no held-out rollouts yet: add_rollouts(...) before scoring")
        return self.scorer.score_groups(drafter, self.holdout.entries, self.holdout.keys).mean

    def save(self, path: str | os.PathLike) -> None:
        """Everything a resumed run needs (`learner_state.state_of`), written atomically
        (`checkpoint.save_checkpoint`): a crash mid-save leaves the previous checkpoint whole."""
        save_checkpoint(state_of(self), path)

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
        restore(learner, state, f"checkpoint {path}")
        return learner

    # ------------------------------------------------------------------ decisions

    def _watchdog(self, served: GroupScores, frozen: GroupScores, candidate: GroupScores,
                  candidate_entries: torch.Tensor | None, break_even: float | None) -> str | None:
        """Revert when the served drafter lost to the frozen one beyond the interval, or to break-even."""
        versus_frozen = paired_gain(served, frozen)
        known = {"frozen": frozen, "served": served}
        if candidate_entries is not None:
            known["candidate"] = candidate
        reason = None
        if versus_frozen.below(self.config.gate_z, self.config.watchdog_margin):
            reason = (f"served version {self.version} scored {versus_frozen.mean:+.4f} ± {versus_frozen.se:.4f} "
                      "below the frozen drafter on held-out")
        elif break_even is not None and served.mean < break_even:
            reason = (f"served version {self.version} scored {served.mean:.4f}, below the γ policy's break-even "
                      f"acceptance {break_even:.4f}")
        return None if reason is None else self._revert(reason, known, candidate_entries)

    def _revert(self, reason: str, known: dict[str, GroupScores],
                candidate_entries: torch.Tensor | None = None) -> str:
        """Publish the best of the `known` drafters ("frozen", "served", "candidate") by their scores."""
        best = max(known, key=lambda name: known[name].mean)
        if best == "served":
            return f"{reason}; kept it: no known drafter scores higher"
        if best == "frozen":
            self._publish(self._snapshot(self.frozen), self._entry_scores.get("frozen"))
            self._load_candidate(self._published)
        else:
            self._publish(self._snapshot(self.averaged), candidate_entries)
        return f"{reason}; reverted to the {best} drafter as version {self.version}"

    def _publish(self, weights: dict[str, torch.Tensor], held_out_entry_scores: torch.Tensor | None) -> None:
        """Serve `weights` as the next version; its per-entry held-out scores, if known, spare a rescoring."""
        self._published = weights
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
        batches: list = []  # drawn a few at a time, grouped by length (`DraftBuffer.sample_batches`)
        for step in range(cfg.max_steps):
            # Stop before a step that would end past the deadline (a step is not short: the LM head's
            # backward over a batch of full contexts), judged by the mean step so far — or, before this
            # round's first, by the last round's (a round with too little budget for one step takes none).
            per_step = (time.perf_counter() - started) / step if step else self._step_s
            if deadline is not None and time.perf_counter() + per_step >= deadline:
                break
            if not batches:
                batches = self.buffer.sample_batches(_BATCHES_PER_DRAW, cfg.batch_size, self._generator)
            batch = batches.pop().to(self.device)
            per_position = loss_fn(self.scorer.log_q(self.model, batch), batch.topk_ids, batch.topk_probs)  # [B, T]
            loss = (per_position * batch.weights).sum() / batch.weights.shape[0]
            self._optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self._warm_up()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            self._optimizer.step()
            self._average()
            losses.append(float(loss.detach()))
            num_positions += batch.num_positions
        self.model.eval()
        if losses:
            self._step_s = _smoothed(self._step_s, (time.perf_counter() - started) / len(losses))
        return losses, num_positions, time.perf_counter() - started

    def _oldest_weighed_version(self) -> int | None:
        """The oldest policy version whose held-out groups still weigh `holdout_min_weight` or more."""
        decay, floor = self.config.holdout_recency_decay, self.config.holdout_min_weight
        if decay >= 1 or floor <= 0:
            return None
        return self.newest_policy_version - math.floor(math.log(floor) / math.log(decay) + 1e-9)

    def _cached(self, name: str) -> GroupScores:
        """The published or frozen drafter's held-out scores, scoring only entries not scored before."""
        known = self._entry_scores.get(name, torch.zeros(0, 2, dtype=torch.float64))
        missing = self.holdout.entries[len(known):]
        if missing:
            model = self.frozen if name == "frozen" else self._published_model()
            known = torch.cat([known, self.scorer.score_entries(model, missing)])
            self._entry_scores[name] = known
        return self._group(known)

    def _group(self, per_entry: torch.Tensor) -> GroupScores:
        return self.scorer.group(per_entry, self.holdout.keys)

    def _published_model(self) -> torch.nn.Module:
        """The published weights in a module: the candidate itself when it is what was published."""
        candidate = dict(self.averaged.named_parameters())
        if all(torch.equal(candidate[n], t) for n, t in self._published.items()):
            return self.averaged
        model = copy.deepcopy(self.frozen)
        copy_into(model, self._published, "published drafter")
        return model

    def _snapshot(self, model: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in (model or self.model).named_parameters()}

    @torch.no_grad()
    def _load_candidate(self, weights: dict[str, torch.Tensor]) -> None:
        """Restart the candidate from `weights` with a fresh optimizer."""
        for model in (self.model, self.averaged):
            for name, param in model.named_parameters():
                param.copy_(weights[name])
        self._optimizer = self._make_optimizer()

    def _make_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        return torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    @torch.no_grad()
    def _average(self) -> None:
        decay = self.config.ema_decay
        for average, param in zip(self.averaged.parameters(), self.model.parameters()):
            average.lerp_(param.detach(), 1.0 - decay)

    def _warm_up(self) -> None:
        """Linear learning-rate warmup over a fresh optimizer's first `warmup_steps` steps: Adam's first
        steps move every parameter by ~lr whatever its gradient, which on a drafter already close to the
        policy is noise that the gate then has to wait out."""
        state = self._optimizer.state
        done = max((int(s["step"]) for s in state.values() if "step" in s), default=0)
        scale = min(1.0, (done + 1) / self.config.warmup_steps) if self.config.warmup_steps else 1.0
        for group in self._optimizer.param_groups:
            group["lr"] = self.config.lr * scale


def _smoothed(estimate: float, measured: float) -> float:
    """Geometric mean of the running estimate and a new measurement (the measurement alone at first):
    one round slowed by a busy machine moves the next round's reserve by √, not by the whole spike."""
    return measured if estimate <= 0 else math.sqrt(estimate * measured)
