"""LearnerConfig: the online learner's settings (budget, optimizer, held-out set, gate, watchdog)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .divergence import LOSSES

COMPUTE_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}  # autocast dtype of training and gate scoring
SIGNAL_SOURCES = ("auto", "engine", "trainer", "forward")  # where the learner's signals come from (`signals`)


@dataclass
class BufferConfig:
    """`max_positions`: completion positions kept in all; `recency_decay` in (0, 1]: weight ratio of
    one policy version to the next newer; `rejected_weight` >= 1: weight of a rejected-draft position."""

    max_positions: int = 200_000
    recency_decay: float = 0.5
    rejected_weight: float = 2.0

    def __post_init__(self) -> None:
        if not (isinstance(self.max_positions, int) and self.max_positions >= 1):
            raise ValueError(f"max_positions={self.max_positions!r} is invalid: an int >= 1")
        if not 0 < self.recency_decay <= 1:
            raise ValueError(f"recency_decay={self.recency_decay!r} is invalid: a number in (0, 1]")
        if not self.rejected_weight >= 1:
            raise ValueError(f"rejected_weight={self.rejected_weight!r} is invalid: a number >= 1")


@dataclass
class LearnerConfig:
    """Per-round budget (`max_steps`, optional `time_budget_s` for the whole round, evaluation
    included; a caller may pass a smaller budget per round), AdamW settings, the held-out set and the gate.

    `warmup_steps`: linear lr warmup of a fresh (or reset) candidate's optimizer. `ema_decay`: the candidate that is
    gated and published is this exponential average of the trained weights. `lr` 1e-4: the safe default (the demo's
    main job, replayed with 8 learner seeds: 1e-4 to 5e-4 end 8.2–9.2 points above the frozen drafter, 1e-3 5.1,
    1.5e-3 3.5: docs/online_learning.md; the demo trains at 2e-4). A held-out group of policy version v weighs
    `holdout_recency_decay ** (newest − v)` in every comparison; groups that would weigh less than
    `holdout_min_weight` leave the held-out set for training (0: keep them, up to `max_holdout_positions`).
    `gate_z`: standard errors a candidate's paired gain must clear to be published, and the served drafter's loss to
    the frozen one must exceed, by `watchdog_margin` more, for the watchdog to revert (1.64: one-sided 5%); a
    candidate more than `reset_margin` below the published drafter (beyond the interval) restarts from it.
    `temperature` must be the rollouts' sampling temperature (1.0 for greedy rollouts, whose signals are the T = 1
    distribution): q is the drafter's softmax at that temperature, as the engine does. `buffer`: the replay store's
    bounds and weights (YAML `learner.buffer:`). `compute_dtype` "bfloat16": training forwards and backwards and the
    gate's scoring run under autocast (weights, gradients and the optimizer stay fp32; `probe` and `score` always
    score in fp32, they are the measure); "auto": bf16 only where the device runs it faster than fp32
    (`online_drafter.autocast`: a CPU without AVX512-BF16/AMX emulates it, ~8× slower). `train_depths`: a head
    learner trains the first n of the draft depths it scores (None: all; the EAGLE head's 1: the first draft only,
    over the target's real features, in one pass instead of two). `record_dir`: a folder to save every input the
    learner gets (`recording.RecordingLearner`; a drafter LM's or a head's learner), for
    `python -m specroll.tools.learner_replay`. `alarm_rounds`, `alarm_min_steps`, `alarm_publish_rounds`: when
    the learner says it stopped learning (`alarms.LearnerAlarms`): fewer than `alarm_min_steps` optimizer steps over
    `alarm_rounds` rounds, or no version for `alarm_publish_rounds` rounds while the probe's frozen drafter falls (the
    demo's healthy runs publish 9–14 versions in 20 rounds).

    Draft vocabularies (`rollout.drafters.draft_vocab`; the size is the engine's `draft_vocab`, the first subset the
    engine's, handed over with `Learner.set_draft_vocab`): the learner counts the completion tokens of the rollouts
    it gets, each policy version's counts weighing `draft_vocab_decay` times the next one's, and with
    `draft_vocab_updates` each round's candidate drafts over the most counted ids — trained and scored over that
    subset, and published with it, so the engine's drafter follows the policy's token frequencies as they drift.
    False: every version keeps the first subset.

    `signals`: where the target's top-k probabilities (and a head's hidden states) the learner trains on come from.
    "engine": recorded by specroll's engine during verification (free); "trainer": captured in the trainer's own
    forward over the rollouts (TRL's GRPO loss pass, `integrations.trl_hook.signal_capture`: no extra target forward,
    the learner trains on a step's rollouts once that step's forward ran); "forward": an extra forward of a policy copy
    over every rollout (`integrations.vllm.signals.TargetSignals`, for an engine that records none); "auto": "engine"
    on specroll's engine, "forward" on vLLM (docs/vllm.md measures what each costs).
    """

    lr: float = 1e-4
    warmup_steps: int = 10
    ema_decay: float = 0.9
    weight_decay: float = 0.0
    batch_size: int = 16
    max_steps: int = 50
    time_budget_s: float | None = None
    loss: str = "kl"
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    holdout_fraction: float = 0.2
    max_holdout_positions: int = 8_000
    holdout_recency_decay: float = 0.5
    holdout_min_weight: float = 0.05
    gate_z: float = 1.64
    watchdog_margin: float = 0.005
    reset_margin: float = 0.02
    min_improvement: float = 0.0
    eval_batch_size: int = 64
    device: str = "cpu"
    seed: int = 0
    buffer: BufferConfig = field(default_factory=BufferConfig)
    compute_dtype: str = "float32"
    train_depths: int | None = None
    record_dir: str | None = None
    alarm_rounds: int = 3
    alarm_min_steps: int = 3
    alarm_publish_rounds: int = 6
    draft_vocab_decay: float = 0.7
    draft_vocab_updates: bool = True
    publish_acceptance: bool = False  # versions carry their held-out acceptance (`served_acceptance.ServedAcceptance`)
    signals: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.buffer, dict):  # from `asdict` (a checkpoint) or a plain mapping
            self.buffer = BufferConfig(**self.buffer)
        checks = [
            ("lr", self.lr > 0, "a number > 0"),
            ("ema_decay", 0 <= self.ema_decay < 1, "a number in [0, 1) (0: judge the trained weights themselves)"),
            ("warmup_steps", isinstance(self.warmup_steps, int) and self.warmup_steps >= 0, "an int >= 0"),
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
            ("holdout_min_weight", 0 <= self.holdout_min_weight < 1, "a number in [0, 1)"),
            ("gate_z", self.gate_z >= 0, "a number >= 0"),
            ("watchdog_margin", self.watchdog_margin >= 0, "a number >= 0"),
            ("reset_margin", self.reset_margin >= 0, "a number >= 0"),
            ("min_improvement", self.min_improvement >= 0, "a number >= 0"),
            ("eval_batch_size", isinstance(self.eval_batch_size, int) and self.eval_batch_size >= 1,
             "an int >= 1"),
            ("compute_dtype", self.compute_dtype in (*COMPUTE_DTYPES, "auto"),
             f"one of {sorted((*COMPUTE_DTYPES, 'auto'))}"),
            ("train_depths",
             self.train_depths is None or (isinstance(self.train_depths, int) and self.train_depths >= 1),
             "None (every depth the head scores) or an int >= 1"),
            ("alarm_rounds", isinstance(self.alarm_rounds, int) and self.alarm_rounds >= 1, "an int >= 1"),
            ("alarm_min_steps", isinstance(self.alarm_min_steps, int) and self.alarm_min_steps >= 0,
             "an int >= 0 (0: never)"),
            ("alarm_publish_rounds", isinstance(self.alarm_publish_rounds, int) and self.alarm_publish_rounds >= 1,
             "an int >= 1"),
            ("draft_vocab_decay", 0 < self.draft_vocab_decay <= 1, "a number in (0, 1] (1: never forget)"),
            ("draft_vocab_updates", isinstance(self.draft_vocab_updates, bool), "True or False"),
            ("publish_acceptance", isinstance(self.publish_acceptance, bool), "True or False"),
            ("signals", self.signals in SIGNAL_SOURCES, f"one of {list(SIGNAL_SOURCES)}"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: {allowed}")
