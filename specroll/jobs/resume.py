"""Resume a `specroll train` run from a trainer checkpoint: what specroll saves beside it, and how it takes it back.

    callback = ResumeCallback(trainer, rollout_func, schedule, backend, config)   # saves at every checkpoint
    saved = find_checkpoint(args.resume); check_matches(saved, config)           # before any model is built
    backend.load_state_dict(saved.backend_state()); restore_run(saved, trainer, rollout_func, schedule)
    trainer.train(resume_from_checkpoint=str(saved.path))   # or load_finished_run at or past grpo.steps

TRL's checkpoint (`checkpoint.every`) holds the policy, its optimizer and scheduler, the trainer's RNG states
and the log history (`trainer_state.json`: the report's metrics.jsonl continues from it). Beside it, at
`on_save` — after TRL wrote its files — specroll first collects the learner round in flight (so nothing of the
learner is half done), then saves (`checkpoints.write_saved_run`, all or nothing):

- the rollout service's `state_dict()`: the learner's whole state (candidate, optimizer, replay buffer,
  held-out set and its cached scores, served and frozen drafters and the version, draft vocabularies and their
  counts, the gate's and the alarms' state, its sampling generator), each engine's own state
  (`SpecEngine.state_dict`: the suffix drafter's history, the γ policy's statistics), and the rollouts generated
  so far;
- the hook's call counter (the seed of every rollout batch is a function of it and `grpo.seed`), the learner
  schedule's probes, events, time totals and counters (the report's probe plot, events and headline go on
  from them), the metrics the round's collection logged for the next step, and `fingerprint(config)`;

and it writes the report's data so far (`report.write_data`: metrics.jsonl, probes.jsonl) into the run's folder.

A resumed run is refused, in one line, when its config differs where a checkpoint cannot follow
(`FINGERPRINT`: the models, the drafter kind, the task, the GRPO data shape and seed, online learning);
everything else (steps, learning rates, the learner's settings, the backend) may change.

Not saved: the cost model's calibration (measured again); the suffix history's n-gram tables are rebuilt from
its completions. Both change speed only, never a token. What is exact, and what only within noise:
docs/resume.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from transformers import TrainerCallback

from specroll.integrations.backend import RolloutBackend
from specroll.integrations.learner_schedule import LearnerSchedule, LearnerTimes
from specroll.integrations.trl_hook import SpecrollRolloutFunc
from specroll.integrations.yaml_config import ConfigError

from .checkpoints import SavedRun, write_saved_run
from .report import write_data
from .train_config import TrainConfig, resolved_dict

logger = logging.getLogger(__name__)

# The config fields a checkpoint is bound to (dotted paths in the resolved config).
FINGERPRINT = (
    "models", "engine.drafters", "engine.draft_vocab", "engine.layer_skip_layers", "engine.eagle_intermediate_size",
    "engine.medusa_heads", "engine.eagle3_layers", "engine.eagle3_ttt_steps", "engine.block_size",
    "engine.block_layers",
    "online_learning", "task.dataset", "task.reward", "grpo.seed", "grpo.num_generations",
    "grpo.prompts_per_step", "grpo.num_train_prompts", "grpo.max_completion_length",
)


def fingerprint(config: TrainConfig) -> dict[str, Any]:
    """The `FINGERPRINT` fields of `config`, flattened to dotted names (the models section field by field)."""
    resolved = resolved_dict(config)
    out: dict[str, Any] = {}
    for path in FINGERPRINT:
        value: Any = resolved
        for part in path.split("."):
            value = value[part]
        if isinstance(value, Mapping):
            out.update({f"{path}.{k}": v for k, v in value.items()})
        else:
            out[path] = value
    return out


def check_matches(saved: SavedRun, config: TrainConfig) -> None:
    """Refuse, in one `ConfigError` line, a checkpoint made with other models, drafter kind, task or data shape."""
    now = fingerprint(config)
    then = saved.run["fingerprint"]
    # a field the checkpoint's specroll did not record yet (the EAGLE-3 and block fields came later) is not held
    # against it: a drafter kind that did not exist then cannot have been its kind
    differ = [key for key in sorted(set(now) | set(then)) if key in then and now.get(key) != then.get(key)]
    if differ:
        shown = "; ".join(f"{key}: checkpoint {then.get(key)!r}, config {now.get(key)!r}" for key in differ[:4])
        more = f"; and {len(differ) - 4} more" if len(differ) > 4 else ""
        raise ConfigError(f"--resume {saved.path}: the checkpoint does not match the config ({shown}{more}): a run "
                          "resumes on the models, drafter kind, task and GRPO data shape it was started with")


class ResumeCallback(TrainerCallback):
    """At every trainer checkpoint, specroll's state beside it (see the module doc). Registered by `specroll
    train` when `checkpoint.every` > 0; one trainer process (several ranks are refused before the run)."""

    def __init__(self, trainer: Any, rollout_func: SpecrollRolloutFunc, schedule: LearnerSchedule,
                 backend: RolloutBackend, config: TrainConfig, resumes: list[dict[str, Any]] | None = None):
        self.trainer = trainer
        self.rollout_func = rollout_func
        self.schedule = schedule
        self.backend = backend
        self.fingerprint = fingerprint(config)
        self.report_dir = config.report.out_dir
        self.resumes = list(resumes or [])

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        started = time.perf_counter()
        if self.rollout_func.learn:  # the learner's state whole: the round in flight collected, its drafter served
            self.rollout_func.collect_learner_round(self.trainer)
        run = capture(self.trainer, self.rollout_func, self.schedule, self.fingerprint, self.resumes)
        folder = write_saved_run(f"{args.output_dir}/{PREFIX_CHECKPOINT_DIR}-{state.global_step}", run,
                                 self.backend.state_dict())
        write_data(self.report_dir, state.log_history, self.schedule.probes)
        logger.info(f"specroll train: step {state.global_step}: specroll's state saved in {folder} "
              f"({time.perf_counter() - started:.1f}s)")


def capture(trainer: Any, rollout_func: SpecrollRolloutFunc, schedule: LearnerSchedule, fingerprint: dict[str, Any],
            resumes: list[dict[str, Any]]) -> dict[str, Any]:
    """run.json's content (plain data) at the trainer's current step."""
    return {
        "step": trainer.state.global_step,
        "fingerprint": fingerprint,
        "hook": {"num_calls": rollout_func.num_calls},
        "schedule": {"probes": schedule.probes, "events": schedule.events, "times": asdict(schedule.times),
                     "num_rounds": schedule.num_rounds, "num_published": schedule.num_published,
                     "update_s": schedule._update_s, "update_tokens": schedule._update_tokens},
        # Logged by the collection above, after TRL logged this step: GRPOTrainer.log averages them into the next.
        "pending_metrics": {key: list(values) for key, values in trainer._metrics["train"].items()},
        "resumes": resumes,
    }


def restore_run(saved: SavedRun, trainer: Any, rollout_func: SpecrollRolloutFunc, schedule: LearnerSchedule) -> None:
    """Put the hook, the schedule and the trainer's pending metrics back as `capture` found them (the policy
    and the trainer's own state come with `trainer.train(resume_from_checkpoint=...)`)."""
    run = saved.run
    rollout_func.num_calls = int(run["hook"]["num_calls"])
    kept = run["schedule"]
    schedule.probes = list(kept["probes"])
    schedule.events = list(kept["events"])
    schedule.times = LearnerTimes(**{f.name: float(kept["times"].get(f.name, 0.0))  # a field newer than the state: 0
                                     for f in fields(LearnerTimes)})
    schedule.num_rounds, schedule.num_published = int(kept["num_rounds"]), int(kept["num_published"])
    schedule._update_s, schedule._update_tokens = kept["update_s"], kept.get("update_tokens")  # older states: none
    schedule._first_rollout_at = time.perf_counter() - schedule.times.wall_s  # the run's wall clock goes on
    for key, values in run["pending_metrics"].items():
        trainer._metrics["train"][key].extend(float(v) for v in values)


def load_finished_run(saved: SavedRun, trainer: Any) -> None:
    """A checkpoint at or past `grpo.steps` (a run killed while it wrote its report) has no step left, but the
    trainer's loop checks `max_steps` only after a step: resumed there, it would train one more. Instead the
    policy and the trainer's state (its log history: the report's metrics) are loaded as that resume would."""
    from transformers import TrainerState
    from transformers.trainer import TRAINER_STATE_NAME

    trainer._load_from_checkpoint(str(saved.path))
    trainer.state = TrainerState.load_from_json(str(saved.path / TRAINER_STATE_NAME))


def resumes_of(saved: SavedRun) -> list[dict[str, Any]]:
    """Every resume of the run so far, this one last: where it resumed (the report's summary lists them)."""
    return [*saved.run.get("resumes", []), {"step": saved.step, "checkpoint": str(saved.path)}]
