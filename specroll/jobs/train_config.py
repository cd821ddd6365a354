"""TrainConfig: one run, loaded from one YAML file — what `specroll train` and the Ray job read alike.

    config = load_train_config("configs/demo.yaml")

Sections: `models` (the demo recipe, or your own `save_pretrained` folders), `grpo` (the TRL
`GRPOTrainer` run; the Ray job reads its rollout shape from it too), `task` (your dataset and reward
by dotted path, or the demo's), `backend` (in-process or Ray, with the Ray
topology and weight transport), `engine` (`EngineConfig`; `engine.kind: vllm` runs rollouts on vLLM), `vllm`
(`VllmSettings`: what only the vLLM engine reads), `learner` (`LearnerConfig`;
`online_learning: false` keeps the drafter frozen), `learner_schedule` (the background round's
budget), `probe` (the drift probe set), `checkpoint` (how often the run saves a checkpoint it can resume
from: `specroll train --resume`, docs/resume.md), `report` (where the report lands and how the end-of-run
speed measurement is done).
Loading goes through the project's typed loader (`config.load_config`): a missing file, an unknown
key, a value of the wrong type or an emptied section fails with a `ConfigError` naming it, and
every section validates its values in `__post_init__`, so a bad config stops before any model is built.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specroll.integrations.ray_backend.settings import SyncConfig, TopologyConfig
from specroll.integrations.vllm.settings import VllmSettings
from specroll.integrations.yaml_config import load_config
from specroll.online_drafter import LearnerConfig
from specroll.rollout import EngineConfig
from specroll.rollout.config import require

MODEL_SOURCES = ("demo", "pretrained")
REPORT_TO = ("tensorboard", "wandb", "trackio", "none")  # the trackers report.report_to may name (TRL's names)
DEMO_RECIPES = ("full", "tiny", "bpe", "bpe_tiny", "tiny_heads32")  # demo.recipe.RECIPE_NAMES
BACKENDS = ("ray", "local")
# GRPOConfig fields `specroll train` sets from its own config (train.py), and the field that sets each: set there,
# never through grpo.extra (TRL would get the keyword twice). The checkpoint section's: `CHECKPOINT_FIELDS`.
SET_FROM_CONFIG = {
    "max_steps": "grpo.steps", "num_generations": "grpo.num_generations",
    "per_device_train_batch_size": "grpo.prompts_per_step (times grpo.num_generations)",
    "max_completion_length": "grpo.max_completion_length", "learning_rate": "grpo.learning_rate",
    "temperature": "grpo.temperature", "beta": "grpo.beta", "num_iterations": "grpo.num_iterations",
    "seed": "grpo.seed", "bf16": "grpo.bf16", "deepspeed": "grpo.deepspeed", "use_cpu": "engine.device",
    "report_to": "report.report_to", "logging_steps": "nothing (specroll logs every step)",
    "disable_tqdm": "nothing (specroll shows its own progress bar)",
}


@dataclass
class ModelsConfig:
    """`source: demo` builds (or loads from cache) the demo recipe's target, drafter and tokenizer;
    `source: pretrained` loads `target` / `drafter` / `tokenizer` folders or hub ids from the local cache,
    and `head` (a `state_dict` file) for an `engine.drafters` "eagle" / "eagle3" / "medusa" / "recurrent" head (null: a
    fresh head; the demo brings its own first version of "eagle" / "medusa", unless `head: fresh` — the cold start,
    docs/get_a_drafter.md); for "eagle3" also a public EAGLE-3 checkpoint folder (speculators or SpecForge layout,
    refused if it does not fit the target: `integrations.formats.eagle3`, docs/drafters.md); for "block" also a
    z-lab DFlash checkpoint folder (`integrations.formats.dflash`, docs/drafters.md).
    With `source: demo`, `drafter: generic` serves the demo's generic drafter LM (trained on the corpus alone,
    never on the target's samples: `demo.generic`) instead of the one distilled from the target.
    `task_max_digits` bounds the demo task's operands (default: the recipe's, 10 for pretrained)."""

    source: str = "demo"
    recipe: str = "full"
    target: str | None = None
    drafter: str | None = None
    tokenizer: str | None = None
    head: str | None = None
    task_max_digits: int | None = None

    def __post_init__(self) -> None:
        require(self.source in MODEL_SOURCES, "models.source", self.source, f"one of {MODEL_SOURCES}")
        require(self.recipe in DEMO_RECIPES, "models.recipe", self.recipe, f"one of {DEMO_RECIPES}")
        if self.source == "pretrained":
            require(bool(self.target), "models.target", self.target, "a model path when source is pretrained")
        else:
            require(self.drafter in (None, "generic"), "models.drafter", self.drafter,
                    "null (the demo's distilled drafter) or 'generic' when source is demo")
        require(self.task_max_digits is None or 1 <= self.task_max_digits <= 18, "models.task_max_digits",
                 self.task_max_digits, "an int in [1, 18] or null")


@dataclass
class GRPOSettings:
    """The GRPO run. `prompts_per_step` unique prompts × `num_generations` completions per step.

    `deepspeed` is a DeepSpeed JSON path handed to `GRPOConfig(deepspeed=...)` (GPU presets);
    `bf16` trains in bfloat16 (GPU presets); `length_grouped` runs the update's forwards over rows grouped by
    completion length, each group cut to its longest (`trl_hook.length_groups`: TRL's loss, less padding);
    `extra` passes any other `GRPOConfig` field through (one that specroll sets from its own fields is refused,
    naming the field to set instead: `SET_FROM_CONFIG`).
    """

    steps: int = 30
    prompts_per_step: int = 8
    num_generations: int = 4
    max_completion_length: int = 64
    learning_rate: float = 1e-4
    temperature: float = 1.0
    beta: float = 0.0
    num_iterations: int = 1
    seed: int = 0
    bf16: bool = False
    deepspeed: str | None = None
    num_train_prompts: int = 512
    length_grouped: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "max_completion_length", "num_iterations", "num_train_prompts"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, f"grpo.{name}", value, "an int >= 1")
        require(isinstance(self.num_generations, int) and self.num_generations >= 2, "grpo.num_generations",
                 self.num_generations, "an int >= 2 (GRPO needs a group to compare)")
        require(self.learning_rate > 0, "grpo.learning_rate", self.learning_rate, "a number > 0")
        require(self.temperature > 0, "grpo.temperature", self.temperature, "a number > 0")
        require(self.beta >= 0, "grpo.beta", self.beta, "a number >= 0")
        require(isinstance(self.length_grouped, bool), "grpo.length_grouped", self.length_grouped, "true or false")
        taken = sorted(set(self.extra) & set(SET_FROM_CONFIG))
        require(not taken, "grpo.extra", taken, "fields specroll sets from its own config: set " + "; ".join(
                f"{SET_FROM_CONFIG[name]} instead of {name}" for name in taken))
        if self.extra:
            from trl import GRPOConfig

            known = {f.name for f in dataclasses.fields(GRPOConfig)}
            unknown = sorted(set(self.extra) - known)
            require(not unknown, "grpo.extra", unknown, "GRPOConfig field names")


@dataclass
class BackendSettings:
    """`kind: ray` runs rollouts on Ray workers (embedded cluster, or the job's cluster under
    `ray job submit`); `kind: local` runs the engine in the trainer's process."""

    kind: str = "ray"
    address: str | None = None
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)

    def __post_init__(self) -> None:
        require(self.kind in BACKENDS, "backend.kind", self.kind, f"one of {BACKENDS}")


@dataclass
class ReportSettings:
    """Where the report lands, the end-of-run speed measurement (spec vs plain, same prompts),
    whether the final policy's flat weights are saved with it (to compare two runs parameter by parameter), and
    which trackers get the trainer's logs (`report_to`, TRL's names: "tensorboard", "wandb", "trackio" or "none";
    null: TensorBoard when it is installed — each writes under `out_dir` unless its own variable says where,
    e.g. `WANDB_DIR`, `WANDB_MODE=offline`)."""

    out_dir: str = "specroll_report"
    speed_prompts: int = 8
    speed_repeats: int = 2
    save_policy: bool = False  # write the final policy's weights to out_dir/policy.safetensors
    report_to: str | list[str] | None = None

    def __post_init__(self) -> None:
        require(bool(self.out_dir), "report.out_dir", self.out_dir, "a folder path")
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        if self.report_to is not None:
            names = self.report_to
            require(all(name in REPORT_TO for name in names) and ("none" not in names or names == ["none"]),
                    "report.report_to", names, f"some of {REPORT_TO} ('none' alone), or null (TensorBoard when "
                    "installed)")
            missing = [name for name in names if name != "none" and importlib.util.find_spec(name) is None]
            require(not missing, "report.report_to", names, f"trackers that are installed: "
                    f"pip install {' '.join(missing)}")
        for name in ("speed_prompts", "speed_repeats"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, f"report.{name}", value, "an int >= 1")


@dataclass
class TaskSettings:
    """What the run trains on (`task_source`): `dataset` and `reward` are dotted paths to your own
    ("package.module:name": `dataset(count, seed)` returns prompts, `reward` is a TRL reward function);
    both unset runs the demo task, whose reward `brevity` (the length ratio of a correct answer) and
    `format_bonus` (every completion in the compact style's grammar) weigh."""

    dataset: str | None = None
    reward: str | None = None
    brevity: float = 1.0
    format_bonus: float = 1.0

    def __post_init__(self) -> None:
        require((self.dataset is None) == (self.reward is None), "task.reward", self.reward,
                "a dotted path when task.dataset is set, and unset when it is not (the demo's own)")
        require(0 <= self.brevity <= 1, "task.brevity", self.brevity, "a number in [0, 1]")
        require(self.format_bonus >= 0, "task.format_bonus", self.format_bonus, "a number >= 0")


@dataclass
class ProbeSettings:
    """The drift probe: `prompts` fixed task prompts (drawn apart from the training prompts, never trained
    on), `samples` fresh samples each, every `every` steps; `prompts: 0` turns it off."""

    prompts: int = 32
    samples: int = 2
    every: int = 5

    def __post_init__(self) -> None:
        require(isinstance(self.prompts, int) and (self.prompts == 0 or self.prompts >= 2), "probe.prompts",
                self.prompts, "0 (off) or an int >= 2")
        for name in ("samples", "every"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, f"probe.{name}", value, "an int >= 1")


@dataclass
class LearnerScheduleSettings:
    """A background learner round may take `rollout_share` of the last rollout's seconds and
    `update_share` of the last policy update's (whichever is smaller); with `cold_uses_update`, a cold start's
    rounds while its rollouts decode plainly (`engine.speculation: when_learned`) take the whole update: the
    trainer stops them when it collects them (`integrations.learner_schedule`)."""

    rollout_share: float = 0.25
    update_share: float = 0.9
    cold_uses_update: bool = True

    def __post_init__(self) -> None:
        for name in ("rollout_share", "update_share"):
            value = getattr(self, name)
            require(0 < value <= 1, f"learner_schedule.{name}", value, "a number in (0, 1]")


# GRPOConfig fields the checkpoint section sets: set there, never through grpo.extra
CHECKPOINT_FIELDS = ("save_strategy", "save_steps", "save_total_limit", "save_only_model", "output_dir")


@dataclass
class CheckpointSettings:
    """A trainer checkpoint every `every` steps and at the last (0: none), with specroll's state beside it
    (`resume`: what it holds); `keep` the newest checkpoints kept (null: all). At least 2: TRL deletes the older
    ones before specroll's state is written beside the newest, so a run killed in between still has one whole.
    `final` keeps what the run ends with, whatever `every` says: the policy and its tokenizer in `out_dir/policy`
    (`save_pretrained`) and the drafter in `out_dir/drafter` (the layout its kind loads in:
    `integrations.drafter_export`)."""

    every: int = 0
    keep: int | None = None
    final: bool = True

    def __post_init__(self) -> None:
        require(isinstance(self.every, int) and self.every >= 0, "checkpoint.every", self.every,
                "an int >= 0 (0: no checkpoints)")
        require(self.keep is None or (isinstance(self.keep, int) and self.keep >= 2), "checkpoint.keep", self.keep,
                "null (keep all) or an int >= 2")


@dataclass
class TrainConfig:
    """One `specroll train` run (see the module docstring)."""

    models: ModelsConfig = field(default_factory=ModelsConfig)
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    task: TaskSettings = field(default_factory=TaskSettings)
    backend: BackendSettings = field(default_factory=BackendSettings)
    engine: EngineConfig = field(default_factory=EngineConfig)
    vllm: VllmSettings = field(default_factory=VllmSettings)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    online_learning: bool = True
    learner_schedule: LearnerScheduleSettings = field(default_factory=LearnerScheduleSettings)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    torch_threads: int | None = None
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    report: ReportSettings = field(default_factory=ReportSettings)

    def __post_init__(self) -> None:
        needed = self.grpo.max_completion_length + 8
        require(self.engine.max_seq_len >= needed, "engine.max_seq_len", self.engine.max_seq_len,
                 f"at least grpo.max_completion_length + a prompt (>= {needed})")
        require(self.torch_threads is None or self.torch_threads >= 1, "torch_threads", self.torch_threads,
                 "an int >= 1 or null")
        set_in_extra = sorted(set(self.grpo.extra) & set(CHECKPOINT_FIELDS))
        require(not set_in_extra, "grpo.extra", set_in_extra, "no checkpoint fields (the checkpoint section sets "
                "them: checkpoint.every, checkpoint.keep; the run's folder is report.out_dir)")
        if self.checkpoint.every:
            # TRL reuses a generation for `num_iterations` updates and does not keep it in a checkpoint: a resumed
            # run generates afresh at its first step, so checkpoints must fall where a generation starts.
            accumulation = int(self.grpo.extra.get("gradient_accumulation_steps", 1))
            per_generation = int(self.grpo.extra.get("steps_per_generation") or accumulation)
            cycle = per_generation * self.grpo.num_iterations
            require(self.checkpoint.every * accumulation % cycle == 0, "checkpoint.every", self.checkpoint.every,
                    f"a multiple of the optimizer steps one generation serves ({cycle} micro-steps of "
                    f"{accumulation}: grpo.num_iterations x steps_per_generation)")
            require(self.learner.record_dir is None, "learner.record_dir", self.learner.record_dir,
                    "null with checkpoint.every > 0 (a recording is one run from its start: it cannot resume)")


def load_train_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read and validate a `specroll train` YAML file, with `section.field=value` `overrides` (the command line's)
    set on it first; a bad value fails with a `ConfigError` naming it."""
    return load_config(path, TrainConfig, overrides)


def resolved_dict(config: TrainConfig) -> dict[str, Any]:
    """The config with every default filled in, as YAML-ready plain data (dtypes by name)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, (str, int, float, bool)) or value is None:
            return value
        return str(value).removeprefix("torch.")

    return plain(config)
