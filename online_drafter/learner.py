"""Learner: distils a drafter toward the moving policy between RL steps, publish-if-better — the one learner seam.

Usage (a run's loop: generate, learn while the trainer updates the policy, publish if better; `engine` is a
`SpecEngine` with `record_signals=True`; a drafter family's learner, `lm.learner.DraftLearner` or
`heads.learner.HeadLearner`, is this class on the family's data)::

    learner = DraftLearner(drafter, LearnerConfig(max_steps=50))
    for step in range(num_steps):
        rollouts = engine.generate(prompts, params)        # signals come with verification
        learner.add_rollouts(rollouts)
        report = learner.train_round(budget_s=...)          # while the trainer updates the policy
        if report.published:
            engine.update_drafter(learner.published_state_dict(), learner.version)
        probe = learner.probe(engine.generate(probe_prompts, params, n=2))   # fresh, never trained on

The learner trains a private fp32 copy of the drafter — the *candidate* (`gate/candidate.py`: warmup, and
the exponential average that is judged and published) — teacher-forced on buffered entries, with the
bucketed forward KL (or TV) to the target's recorded top-k (`divergence.py`). It never holds the
target: everything it knows of p is the recorded top-k, so no gradient reaches the policy. What it
trains on and how a drafter is scored are a family's: its replay buffer (`buffer.ReplayBuffer` over the
family's entries), its scorer (`scorer.Scorer`: `loss`, `score_entries`, `group`) and how a rollout
becomes an entry (`to_entry`). Every decision below is this module's, the same for every family. It keeps
no files: a family that resumes runs offers that itself (`DraftLearner.save`/`load`).

Decisions are paired comparisons on the same positions with a group-clustered interval (`gate/paired.py`):

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
- **Alarms.** A learner that stops learning (too few optimizer steps over a few rounds, nothing published
  while the probe shows the frozen drafter falling, probe scoring longer than a round) says so in its
  reports (`gate/alarms.py`): a stalled learner must be loud, never a quiet run with a stale drafter.
- **Frozen shadow.** The initial drafter, scored on the same positions: what no online learning
  would give. `probe` scores served and frozen on rollouts of a fixed probe set of prompts, fresh at
  each policy version — the honest drift measure; held-out numbers move with the prompts a step drew.

The watchdog's rule is `gate/watchdog.py`'s; round, gate, revert and probe share one held-out cache (`_entry_scores`,
`gate/held_out_scores.py`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specroll.rollout import Rollout
from specroll.rollout.drafters.draft_vocab import STATE_KEY as VOCAB_STATE_KEY
from specroll.rollout.models.weights import copy_into

from . import autocast
from .buffer import BufferEntry, ReplayBuffer
from .divergence import LOSSES
from .gate.alarms import LearnerAlarms
from .gate.candidate import Candidate, TrainResult, smoothed, weights_of
from .gate.held_out_scores import HeldOutScores
from .gate.holdout import GroupKey, HoldoutSet
from .gate.paired import GroupScores, paired_gain
from .gate.watchdog import watchdog_reason
from .learner_config import LearnerConfig
from .reports import LearnerReport, ProbeReport
from .scorer import Scorer
from .token_counts import DraftVocabs, TokenCounts


class Learner(HeldOutScores):
    """Online drafter distillation with a paired publish gate and a watchdog (see module doc), over a drafter
    family's `buffer`, `scorer` and `to_entry` (a rollout's entry, or None where there is nothing to learn)."""

    def __init__(self, drafter: nn.Module, config: LearnerConfig, buffer: ReplayBuffer, scorer: Scorer,
                 to_entry: Callable[[Any], BufferEntry | None]):
        self.config = config
        self.device = torch.device(config.device)
        self.candidate = Candidate(drafter, config, self.device)
        self.frozen = copy.deepcopy(self.candidate.model).eval().requires_grad_(False)
        self.published = copy.deepcopy(self.frozen)
        self.buffer = buffer
        self.holdout = HoldoutSet(config.holdout_fraction, config.max_holdout_positions)
        self.scorer = scorer
        self.to_entry = to_entry
        # Every budget decision reads this clock (seconds); a replay (`tools.learner_replay`) sets a
        # virtual one that charges each forward a fixed cost.
        self.clock: Callable[[], float] = time.perf_counter
        self.version = 0
        self.newest_policy_version = -1
        self._published_weights = weights_of(self.published)
        self._generator = torch.Generator().manual_seed(config.seed)
        self._entry_scores: dict[str, torch.Tensor] = {}  # the held-out cache (`held_out_scores`)
        self._scoring_s_per_entry = 0.0  # the last gate's scoring, per entry scored
        self._trained_since_gate_s = 0.0  # candidate training since it was last scored
        self._candidate_changed = False  # trained since it was last scored
        self.alarms = LearnerAlarms(config)
        self.vocab: DraftVocabs | None = None  # draft vocabularies (`set_draft_vocab`); None: the whole one

    # ------------------------------------------------------------------ public API

    def set_draft_vocab(self, ids: torch.Tensor, vocab_size: int) -> None:
        """Drafters draft over N of `vocab_size` ids, first the engine's `ids` [N]; then each round's candidate over the
        N most counted (`config.draft_vocab_updates`), published with its weights. Call before the first round."""
        self.vocab = DraftVocabs(ids, vocab_size, self.config.draft_vocab_decay)
        self._entry_scores.clear()

    @property
    def token_counts(self) -> TokenCounts | None:  # the counts the draft vocabulary is chosen from
        return None if self.vocab is None else self.vocab.counts

    def add_rollouts(self, rollouts: list[Rollout]) -> None:
        """Buffer rollouts (generated with `record_signals=True`), holding a stride of prompt groups out."""
        if self.vocab is not None:
            self.vocab.count(rollouts)
        for entry in filter(None, map(self.to_entry, rollouts)):
            if not self.holdout.offer(entry, _key(entry)):
                self.buffer.add([entry])
            self.newest_policy_version = max(self.newest_policy_version, entry.policy_version)
        dropped = self.holdout.trim(self._oldest_weighed_version())
        self.buffer.add(dropped)
        for name, scores in self._entry_scores.items():
            self._entry_scores[name] = scores[len(dropped):]

    def train_round(self, budget_s: float | None = None, break_even: float | None = None,
                    stop: Callable[[], bool] | None = None) -> LearnerReport:
        """Train the candidate within the budget, gate it against the published drafter, run the watchdog.

        `budget_s` caps this round (with `config.time_budget_s`, whichever is smaller), evaluation
        included; `break_even` is the acceptance below which speculation stops paying (from the γ
        policy), for the watchdog; `stop()` true ends the training early (the trainer wants the round now:
        checked before every step after the first), the gate as planned.
        """
        if not self.holdout:
            raise ValueError("no held-out rollouts yet: add_rollouts(...) before train_round()")
        started = self.clock()
        if self.vocab is not None and self.config.draft_vocab_updates and self.vocab.recount():
            self._candidate_changed = True  # this round's candidate drafts over the most counted ids: judged again
        budgets = [b for b in (budget_s, self.config.time_budget_s) if b is not None]
        budget = min(budgets) if budgets else None
        # A gate scores the candidate on every held-out entry and the published and frozen drafters on
        # the entries they have not seen; it is reserved (with a margin) from the round's budget, and
        # taken once the candidate has trained at least as long as a gate costs (on short budgets
        # scoring every round would leave no time to train). A gate that is due runs even where it does
        # not fit this round's budget: the overrun is taken from later rounds (the schedule's budget is
        # cumulative), where skipping it left a trained candidate unjudged for the rest of the run
        # (replayed main job: no gate in the last 4 rounds, candidate +6.7 points vs served +4.7). A
        # round that does not gate only trains.
        unscored = sum(len(self.holdout) - len(self._entry_scores.get(n, ())) for n in ("published", "frozen"))
        eval_cost = 1.2 * self._scoring_s_per_entry * (len(self.holdout) + unscored)
        gate = budget is None or self._trained_since_gate_s + max(0.0, budget - eval_cost) >= eval_cost
        deadline = None if budget is None else started + max(0.0, budget - (eval_cost if gate else 0.0))
        trained = self._train(deadline, stop)
        self._trained_since_gate_s += trained.seconds
        self._candidate_changed = self._candidate_changed or bool(trained.losses)
        gate = gate and self._candidate_changed
        losses = trained.losses
        report = dict(loss=sum(losses) / len(losses) if losses else math.nan, train_time_s=trained.seconds,
                      budget_s=budget, num_positions=trained.num_positions, num_steps=len(losses),
                      policy_version=self.newest_policy_version, gated=gate)
        if not gate:
            nan = math.nan
            return self._with_alarms(LearnerReport(
                published=False, version=self.version, acceptance_before=nan, acceptance_after=nan,
                acceptance_frozen_shadow=nan, gain=nan, gain_se=nan, eval_time_s=0.0,
                round_time_s=self.clock() - started, num_holdout_groups=len(set(self.holdout.keys)),
                num_holdout_positions=sum(e.num_positions for e in self.holdout.entries), **report))
        scored = self.clock()
        published, frozen = self._cached("published"), self._cached("frozen")
        with self._compute(), self.scorer.over(self.draft_vocab("candidate")):
            candidate_entries = self.scorer.score_entries(self.candidate.averaged, self.holdout.entries)
        self._scoring_s_per_entry = smoothed(self._scoring_s_per_entry,
                                             (self.clock() - scored) / (len(self.holdout) + unscored))
        self._trained_since_gate_s, self._candidate_changed = 0.0, False
        candidate = self._group(candidate_entries)
        gain = paired_gain(candidate, published)
        z, event = self.config.gate_z, None
        publish = gain.above(z, self.config.min_improvement)
        if publish:
            self._publish(weights_of(self.candidate.averaged), candidate_entries, self.draft_vocab("candidate"))
        elif gain.below(z, self.config.reset_margin):
            self.candidate.restart(self._published_weights)
            event = f"candidate reset to version {self.version}: it scored {gain.mean:+.4f} ± {gain.se:.4f} below it"
        served = self._cached("published")
        reason = watchdog_reason(served, frozen, break_even, "held-out", self.version, self.config)
        if reason is not None:
            event = self._revert(reason, {"served": served, "frozen": frozen, "candidate": candidate},
                                 candidate_entries)
        return self._with_alarms(LearnerReport(
            published=publish or reason is not None, version=self.version, acceptance_before=published.mean,
            acceptance_after=candidate.mean, acceptance_frozen_shadow=frozen.mean, gain=gain.mean, gain_se=gain.se,
            eval_time_s=self.clock() - scored, round_time_s=self.clock() - started,
            num_holdout_positions=published.num_positions, num_holdout_groups=int(published.counts.shape[0]),
            event=event, **report))

    @torch.inference_mode()
    def probe(self, rollouts: list[Rollout]) -> ProbeReport:
        """Score the served and the frozen drafter on probe rollouts (not buffered); revert if served lost.

        The rollouts should be fresh samples of a fixed set of prompts at the current policy version,
        generated with `record_signals=True`, and never given to `add_rollouts`.
        """
        started = self.clock()
        entries = [e for e in map(self.to_entry, rollouts) if e is not None]
        keys = [_key(e) for e in entries]
        with self.scorer.over(self.draft_vocab("published")):
            served = self.scorer.group(self.scorer.score_entries(self.published, entries), keys)
        with self.scorer.over(self.draft_vocab("frozen")):
            frozen = self.scorer.group(self.scorer.score_entries(self.frozen, entries), keys)
        gain = paired_gain(served, frozen)
        version, event = self.version, None
        reason = watchdog_reason(served, frozen, None, "probe", self.version, self.config)
        if reason is not None:
            event = self._revert(reason, {"served": served, "frozen": frozen})
        report = ProbeReport(
            served=served.mean, frozen=frozen.mean, gain=gain.mean, gain_se=gain.se, served_se=served.se,
            frozen_se=frozen.se, num_positions=served.num_positions, num_groups=int(served.counts.shape[0]),
            policy_version=max(e.policy_version for e in entries), drafter_version=version, event=event,
            time_s=self.clock() - started, served_group_sums=served.sums.tolist(),
            group_counts=served.counts.tolist())
        self.alarms.after_probe(report)
        return report

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters of the published version, for `engine.update_drafter(sd, learner.version)` (its draft
        vocabulary under `draft_vocab.STATE_KEY`, if any): the learner's own snapshot, the engine copies it."""
        if self.vocab is None:
            return self._published_weights
        return {**self._published_weights, VOCAB_STATE_KEY: self.vocab.ids["published"]}

    def draft_vocab(self, name: str = "published") -> torch.Tensor | None:
        """The draft vocabulary [N] of the "frozen", "published" or "candidate" drafter (None: the whole one)."""
        return None if self.vocab is None else self.vocab.ids[name]

    def revert_served(self, reason: str) -> str:
        """The rollouts showed the served drafter collapsed where its held-out score says it should not: the
        watchdog's revert without it — publish the better of the frozen drafter and the candidate as a new
        version. Returns the event."""
        if not self.holdout:
            raise ValueError("no held-out rollouts yet: add_rollouts(...) before revert_served()")
        with self._compute(), self.scorer.over(self.draft_vocab("candidate")):
            candidate_entries = self.scorer.score_entries(self.candidate.averaged, self.holdout.entries)
        known = {"frozen": self._cached("frozen"), "candidate": self._group(candidate_entries)}
        return self._revert(reason, known, candidate_entries)

    # ------------------------------------------------------------------ decisions

    def _with_alarms(self, report: LearnerReport) -> LearnerReport:
        """The round's report with the alarms it raises (the learner stopped learning: `gate/alarms.py`)."""
        raised = self.alarms.after_round(report, self.candidate.step_s)
        return dataclasses.replace(report, alarms=raised, alarms_active=self.alarms.active)

    def _revert(self, reason: str, known: dict[str, GroupScores],
                candidate_entries: torch.Tensor | None = None) -> str:
        """Publish the best of the `known` drafters ("served", "frozen", "candidate") by their scores; on a
        tie the first named (a served drafter that is still the frozen one is kept, and the candidate with it)."""
        best = max(known, key=lambda name: known[name].mean)
        if best == "served":
            return f"{reason}; kept it: no known drafter scores higher"
        if best == "frozen":
            self._publish(weights_of(self.frozen), self._entry_scores.get("frozen"), self.draft_vocab("frozen"))
            self.candidate.restart(self._published_weights)
        else:
            self._publish(weights_of(self.candidate.averaged), candidate_entries, self.draft_vocab("candidate"))
        return f"{reason}; reverted to the {best} drafter as version {self.version}"

    def _publish(self, weights: dict[str, torch.Tensor], held_out_entry_scores: torch.Tensor | None,
                 vocab_ids: torch.Tensor | None) -> None:
        """Serve `weights` (over the draft vocabulary `vocab_ids`) as the next version; its per-entry held-out
        scores, if known, spare a rescoring."""
        self._set_published(weights)
        if self.vocab is not None:
            self.vocab.ids["published"] = vocab_ids
        self.version += 1
        if held_out_entry_scores is None:
            self._entry_scores.pop("published", None)
        else:
            self._entry_scores["published"] = held_out_entry_scores.clone()

    def _set_published(self, weights: dict[str, torch.Tensor]) -> None:
        copy_into(self.published, weights, "published drafter")
        self._published_weights = weights

    # ------------------------------------------------------------------ internals

    def _train(self, deadline: float | None, stop: Callable[[], bool] | None = None) -> TrainResult:
        if len(self.buffer) == 0:
            return TrainResult()
        loss_fn = LOSSES[self.config.loss]
        ids = self.draft_vocab("candidate")

        def loss(model: nn.Module, batch: Any) -> torch.Tensor:
            with self._compute(), self.scorer.over(ids):  # the backward runs outside, as autocast wants
                return self.scorer.loss(model, batch, loss_fn)

        return self.candidate.train(
            lambda n: self.buffer.sample_batches(n, self.config.batch_size, self._generator), loss, deadline,
            self.clock, stop)

    def _compute(self) -> contextlib.AbstractContextManager:
        """Where training and the gate's scoring run: `autocast.context` of `config.compute_dtype`."""
        return autocast.context(self.config.compute_dtype, self.device)

    def _oldest_weighed_version(self) -> int | None:
        """The oldest policy version whose held-out groups still weigh `holdout_min_weight` or more."""
        decay, floor = self.config.holdout_recency_decay, self.config.holdout_min_weight
        if decay >= 1 or floor <= 0:
            return None
        return self.newest_policy_version - math.floor(math.log(floor) / math.log(decay) + 1e-9)

def _key(entry: BufferEntry) -> GroupKey:
    """An entry's prompt group: its policy version and prompt ids (siblings share both)."""
    return entry.policy_version, tuple(entry.token_ids[: entry.prompt_len].tolist())
