"""SpecrollRolloutFunc: specroll as TRL's `GRPOTrainer(rollout_func=...)` hook.

Usage::

    rollout_func = SpecrollRolloutFunc(LocalBackend.from_models(target, drafter, engine_cfg, learner_cfg))
    trainer = GRPOTrainer(model=policy, reward_funcs=reward, args=grpo_args, train_dataset=ds,
                          processing_class=tokenizer, rollout_func=rollout_func)

TRL 1.16 calls `rollout_func(prompts, trainer)` with this process's prompts, each repeated
`num_generations` (G) times in a row by its `RepeatSampler`, and expects a dict with `prompt_ids`,
`completion_ids` and `logprobs`, one entry per prompt entry, in order; every other key is forwarded
to the reward functions (one value per entry). On each call this hook:

1. for a training batch, collects the online draft-learning round that ran in the background since
   the previous step's rollouts (`LearnerSchedule`: it ran while the trainer updated the policy),
   publishing its drafter if the version moved; then syncs the policy to the backend when
   `trainer.state.global_step` moved since the last sync (plain, PEFT or ZeRO-3 models, see
   `policy_sync`), tagging it with the step as its version;
2. applies the chat template to conversational prompts, exactly as TRL's own generation path does;
3. generates each group once with n = G — one backend call for all the unique prompts — instead of
   G separate generations, so siblings share the batch (and, on Ray, the worker); a rollout that
   failed (non-finite target logits) raises `RolloutError`, naming its decoded prompt and carrying
   every rollout of the batch, instead of handing TRL a completion cut short by a fault; a rollout
   from any policy version but the current step's raises too (a stale backend never trains silently);
4. for a training batch, starts the next learner round (with a probe of the served drafter every
   few steps) without waiting for it. With `learner.signals: trainer` (`backend.trainer_signals()`), the
   rollouts reach the learner a step late: TRL's loss forward over step t's rollouts captures their signals
   (`signal_capture.TrainerSignalCapture`), and step t + 1's call hands them to the backend before its round
   starts — no round starts before the first signals arrived;
5. appends `rollout/*` (the backend's `BatchStats` of the step, `backend.rollout_metrics`), the
   backend's versions and sync times, `drafter/*` (whether the step drafted at all among them:
   `LearnerSchedule.speculation_seen`) and `weights/sync_s` to the trainer's metrics, which
   `GRPOTrainer.log` averages into `log_history` and every `report_to` target alongside its own
   (docs/metrics.md defines each).

At its first call the hook also registers a `PolicySyncCallback` on the trainer, which collects the
last learner round and syncs once more when `trainer.train()` ends: the last optimizer step happens
after the last rollout, so without it evaluation, saving or a speed measurement after training
would run the policy one step behind.

Under `accelerate launch` every rank runs its own hook with its own prompts, on one of two kinds of backend:

- **one service shared by all ranks** (`backend.serves_all_ranks()`: the Ray controller of
  `ray_backend.shared_service`): every rank enters the (ZeRO-3-collective) gather, the main rank alone
  keeps the weights and syncs the service once, then a barrier; the other ranks `await_policy` the
  step's version before they generate. Each rank's rollouts go to the shared learner; after a barrier
  (every rank's rollouts are in), the main rank alone runs the learner round, so it runs once per step
  on all of them. The service's metrics (versions, sync times, `drafter/*`) are logged on the main
  rank, each rank's own rollout metrics on that rank;
- **one backend per rank** (`LocalBackend`): each rank gathers the full weights, syncs its own backend
  and runs its own learner rounds (a warning says so once: the ranks' drafters learn apart).

Departure from TRL's vLLM path: sampling knobs the engine does not implement (`min_p`,
`repetition_penalty`) raise instead of being silently ignored.
"""

from __future__ import annotations

import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback
from trl.data_utils import is_conversational

from specroll.integrations.backend import RolloutBackend, RolloutError, raise_for_errors, rollout_metrics
from specroll.integrations.learner_schedule import LearnerSchedule, ProbeSet
from specroll.rollout import Rollout, SamplingParams
from specroll.rollout.core.stats import BatchStats

from .policy_sync import gather_policy_weights
from .signal_capture import TrainerSignalCapture


class SpecrollRolloutFunc:
    """A `rollout_func` for TRL's GRPOTrainer backed by any `RolloutBackend` (in-process or Ray).

    `learn=False` skips online draft-learning rounds (the drafter stays as loaded); `probe` (prompts
    in the dataset's format) measures the served drafter against the frozen one every few steps;
    `schedule` sets the learner's budget shares (see `LearnerSchedule`). `between_steps`, if given, is
    called at each training call once the previous step is wholly done (its update and its learner round
    collected) and before anything of this step runs: where `tools.interleave` hands the machine to
    a paired run, so that two runs take turns step by step.
    """

    def __init__(self, backend: RolloutBackend, learn: bool = True, probe: ProbeSet | None = None,
                 schedule: LearnerSchedule | None = None, between_steps: Callable[[], None] | None = None):
        self.backend = backend
        self.between_steps = between_steps
        self.learn = learn
        self.schedule = schedule or LearnerSchedule()
        if probe is not None:
            self.schedule.probe = probe
        self.synced_step: int | None = None
        self.num_calls = 0
        self._attached_to: Any = None
        self._probe_ids: list[list[int]] | None = None
        self.capture: TrainerSignalCapture | None = None  # with `learner.signals: trainer`, set at the first call

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        if self._attached_to is not trainer:  # TRL hands the hook its trainer only here
            refuse_trl_vllm(trainer)
            trainer.add_callback(PolicySyncCallback(self, trainer))
            self._attached_to = trainer
            _warn_if_per_rank(self.backend, trainer)
            request = self.backend.trainer_signals() if self.learn else None
            self.capture = None if request is None else TrainerSignalCapture(request)
            if self.capture is not None:
                self.capture.attach(trainer)
        mode = "train" if trainer.model.training else "eval"
        step = trainer.state.global_step
        learns = mode == "train" and self.learn
        drives = self.drives_service(trainer)
        if learns and drives:
            self.collect_learner_round(trainer)  # before the sync: on Ray the probe still uses the workers
            if self.capture is not None:
                self.hand_signals(trainer)
        if mode == "train" and self.between_steps is not None:
            self.between_steps()
        if step != self.synced_step:  # evaluation, too, sees the current policy
            self.sync_policy(trainer)
        prompt_ids = tokenize_prompts(prompts, trainer)
        group_size = trainer.num_generations if mode == "train" else trainer.num_generations_eval
        params = sampling_params(trainer, self.num_calls)
        started = time.perf_counter()
        rollouts, stats = self._generate_groups(prompt_ids, group_size, params, trainer)
        seconds = time.perf_counter() - started
        check_policy_version(rollouts, step, trainer.accelerator.process_index)
        if learns and self.capture is not None:
            self.capture.expect(rollouts, params, step)
        self.num_calls += 1
        service = self.backend.metrics() if drives else {}
        drafted = self.schedule.speculation_seen(step, stats, service.get("drafter/version")) if mode == "train" else {}
        self._log(trainer, mode, rollout_metrics(stats) | service | drafted)
        if learns and self.backend.serves_all_ranks():
            trainer.accelerator.wait_for_everyone()  # every rank's rollouts are in the shared learner's buffer
        if learns and drives:
            self.schedule.rollout_done(seconds, started, stats.generated_tokens)
        if learns and drives and (self.capture is None or self.capture.handed):
            probe = self.schedule.probe_request(step, self._probe_prompt_ids(trainer), params,
                                                last_step=trainer.state.max_steps - 1)
            self.backend.start_learner_round(self.schedule.budget(), probe)
            self.schedule.round_started()
        return {
            "prompt_ids": [r.prompt_ids for r in rollouts],
            "completion_ids": [r.completion_ids for r in rollouts],
            "logprobs": [r.logprobs for r in rollouts],
            "rollout_acceptance_rate": [r.acceptance_rate for r in rollouts],
            "rollout_policy_version": [r.policy_version for r in rollouts],
            "rollout_drafter_version": [r.drafter_version for r in rollouts],
        }

    def drives_service(self, trainer: Any) -> bool:
        """Whether this rank syncs the backend and runs its learner: every rank with a backend of its own,
        only the main rank for a service shared by all ranks."""
        return trainer.accelerator.is_main_process or not self.backend.serves_all_ranks()

    def sync_policy(self, trainer: Any) -> float:
        """Bring the backend to the trainer's current policy (version = global step); returns seconds.

        Every process walks the parameters (ZeRO-3 gathers are collective). With a backend per rank,
        each keeps the full weights and syncs its own; with a shared service, the main rank syncs it
        once, all ranks meet at a barrier, and the others check that it serves this step's version
        (`await_policy` raises otherwise).
        """
        started = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        step = trainer.state.global_step
        drives = self.drives_service(trainer)
        named = gather_policy_weights(model, keep=drives)
        if drives:
            self.backend.sync_policy(named, step)
        if self.backend.serves_all_ranks():
            trainer.accelerator.wait_for_everyone()  # the main rank's sync is committed before any rank generates
            if not drives:
                self.backend.await_policy(step)
        self.synced_step = step
        seconds = time.perf_counter() - started
        self._log(trainer, "train", {"weights/sync_s": seconds})
        return seconds

    def collect_learner_round(self, trainer: Any) -> None:
        """Collect the background learner round — stopping its training: the trainer wants its next rollouts, so
        every learner second from here on is one it waits — publishing its drafter if the version moved; log it."""
        self._log(trainer, "train", self.schedule.round_collected(self.backend.finish_learner_round(stop=True)))

    def hand_signals(self, trainer: Any) -> None:
        """Hand the backend the last training call's rollouts whose signals its loss forward captured; log how many
        arrived, how many no forward covered, and the capture's seconds (`signals/*`)."""
        capture = self.capture
        missed, seconds = capture.missed, capture.seconds
        arrived = capture.take()
        if not arrived and capture.missed == missed:
            return  # nothing was expected: the first step
        if arrived:
            self.backend.add_trainer_signals(arrived)
        self._log(trainer, "train", {"signals/captured": len(arrived), "signals/missed": capture.missed - missed,
                                     "signals/capture_s": seconds})
        capture.seconds = 0.0

    def _probe_prompt_ids(self, trainer: Any) -> list[list[int]] | None:
        if self.schedule.probe is None:
            return None
        if self._probe_ids is None:
            self._probe_ids = tokenize_prompts(self.schedule.probe.prompts, trainer)
        return self._probe_ids

    def _generate_groups(self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams,
                         trainer: Any) -> tuple[list[Rollout], BatchStats]:
        """One backend call per distinct group size (normally one call): the rollouts in entry order and
        the calls' `BatchStats` summed.

        Raises `RolloutError` naming the decoded prompts whose rollouts failed (indices = batch entries).
        """
        groups = find_groups(prompt_ids, group_size)
        out: list[Rollout | None] = [None] * len(prompt_ids)
        stats = BatchStats()
        by_size: dict[int, list[int]] = defaultdict(list)
        for start, size in groups:
            by_size[size].append(start)
        for size, starts in by_size.items():
            try:
                rollouts = self.backend.generate([prompt_ids[s] for s in starts], params, n=size)
            except RolloutError as err:  # raised again below for the whole batch, once every call is in
                rollouts = err.rollouts
            stats += self.backend.batch_stats()
            for i, start in enumerate(starts):
                out[start : start + size] = rollouts[i * size : (i + 1) * size]
        decode = trainer.processing_class.decode
        raise_for_errors(out, lambda i: f"prompt {_shorten(decode(prompt_ids[i]))!r}")  # type: ignore[arg-type]
        return out, stats  # type: ignore[return-value]

    @staticmethod
    def _log(trainer: Any, mode: str, metrics: dict[str, float]) -> None:
        # GRPOTrainer.log averages `_metrics[mode]` into the logs it reports, then clears it.
        for key, value in metrics.items():
            trainer._metrics[mode][key].append(float(value))


class PolicySyncCallback(TrainerCallback):
    """Collects the last learner round and syncs the hook's backend to the trainer's final policy when
    `trainer.train()` ends.

    `SpecrollRolloutFunc` registers it on its trainer at its first call. Transformers calls
    `on_train_end` on every process, so every ZeRO-3 rank joins the collective gather.
    """

    def __init__(self, rollout_func: SpecrollRolloutFunc, trainer: Any):
        self.rollout_func = rollout_func
        self.trainer = trainer

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rollout_func = self.rollout_func
        if rollout_func.learn and rollout_func.drives_service(self.trainer):
            rollout_func.collect_learner_round(self.trainer)  # the last step's round: its probe, its drafter
        if state.global_step != rollout_func.synced_step:
            rollout_func.sync_policy(self.trainer)


def check_policy_version(rollouts: list[Rollout], step: int, rank: int) -> None:
    """Raise when a rollout does not come from the policy of the trainer's `step`: a stale rank must fail,
    never train on another policy's samples (TRL applies no importance correction to them)."""
    stale = sorted({r.policy_version for r in rollouts} - {step})
    if stale:
        raise RuntimeError(f"rank {rank}: rollouts from policy versions {stale}, but the trainer is at step {step} "
                           "(its backend missed a policy sync)")


def refuse_trl_vllm(trainer: Any) -> None:
    """A trainer built with `use_vllm=True` starts TRL's own vLLM and syncs its weights every step, though this hook
    makes every rollout: refused in one line, saying how vLLM runs through specroll instead."""
    if getattr(trainer.args, "use_vllm", False):
        raise ValueError("GRPOConfig(use_vllm=True) is invalid with specroll's rollout_func: TRL would start and sync "
                         "its own vLLM that never generates; set use_vllm=False, and to roll out on vLLM run it "
                         "through specroll (engine.kind: vllm)")


def _warn_if_per_rank(backend: RolloutBackend, trainer: Any) -> None:
    if trainer.accelerator.num_processes > 1 and not backend.serves_all_ranks() and trainer.accelerator.is_main_process:
        warnings.warn(f"{trainer.accelerator.num_processes} trainer ranks, each with its own {type(backend).__name__}: "
                      "every rank syncs its own engine and runs its own learner (their drafters learn apart); one "
                      "rollout service for all ranks needs the Ray backend (specroll.integrations.ray_backend."
                      "shared_service)", stacklevel=3)


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def find_groups(prompt_ids: list[list[int]], group_size: int) -> list[tuple[int, int]]:
    """(start, size) of each GRPO group: TRL repeats every prompt `group_size` times in a row.

    Entries that do not split into uniform chunks of `group_size` fall back to runs of identical
    consecutive prompts, so a caller that does not repeat prompts still gets one sample per entry.
    """
    chunks = [(s, group_size) for s in range(0, len(prompt_ids), group_size)]
    if len(prompt_ids) % group_size == 0 and all(
        prompt_ids[s + j] == prompt_ids[s] for s, size in chunks for j in range(size)
    ):
        return chunks
    groups: list[tuple[int, int]] = []
    for i, ids in enumerate(prompt_ids):
        if groups and prompt_ids[groups[-1][0]] == ids:
            groups[-1] = (groups[-1][0], groups[-1][1] + 1)
        else:
            groups.append((i, 1))
    return groups


def tokenize_prompts(prompts: list[Any], trainer: Any) -> list[list[int]]:
    """Prompt token ids as TRL's own generation path builds them (chat template for conversations)."""
    if not prompts:
        raise ValueError("rollout_func received no prompts")
    processing_class = trainer.processing_class
    if is_conversational({"prompt": prompts[0]}):
        tokenized = processing_class.apply_chat_template(
            conversation=prompts,
            tools=getattr(trainer, "tools", None) or None,
            chat_template=trainer.chat_template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **trainer.chat_template_kwargs,
        )
        ids = tokenized["input_ids"]
    else:
        ids = processing_class(text=prompts)["input_ids"]
    return [list(map(int, row)) for row in ids]


def sampling_params(trainer: Any, call_index: int) -> SamplingParams:
    """The trainer's generation settings as engine `SamplingParams`; rejects knobs the engine lacks."""
    if trainer.min_p not in (None, 0.0):
        raise ValueError(f"min_p={trainer.min_p!r} is not supported by specroll: allowed None or 0.0")
    if trainer.repetition_penalty != 1.0:
        raise ValueError(
            f"repetition_penalty={trainer.repetition_penalty!r} is not supported by specroll: allowed 1.0"
        )
    args = trainer.args
    seed = (args.seed * 1_000_003 + call_index * 101 + trainer.accelerator.process_index) % 2**62
    return SamplingParams(
        max_new_tokens=trainer.max_completion_length,
        temperature=trainer.temperature,
        top_k=trainer.top_k or 0,
        top_p=trainer.top_p if trainer.top_p is not None else 1.0,
        stop_token_ids=tuple(trainer.eos_token_ids),
        seed=seed,
    )
