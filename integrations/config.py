"""Run configuration for the Ray backend, and the typed YAML loader every specroll config goes through.

One YAML file describes a run: where the models live, how many rollout workers and what each one
gets from the cluster, how they are placed, how weights travel, and the engine / sampling / learner
settings. `load_config(path, RayRunConfig)` turns it into validated dataclasses. The loader is
generic and other modules reuse it: each value is checked against its field's type hint (nested
dataclasses are sections and must be mappings; `X | None`, `Literal`, lists and tuples are
understood; a bool is never an int; an int or a numeric string such as PyYAML's `'3e-4'` is taken
as a float), unknown keys fail, and the dataclass's own `__post_init__` checks the ranges. Every
failure is a `ConfigError` (a `ValueError`) naming `section.field`, the value and what is allowed,
so a typo or a wrong type never silently falls back to a default or crashes after models are built.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from specroll.online_drafter import LearnerConfig
from specroll.rollout import EngineConfig, SamplingParams
from specroll.rollout.config import require

T = TypeVar("T")

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
TRANSPORTS = ("object_store", "torch_distributed")
DIST_BACKENDS = ("gloo", "nccl")


@dataclass
class ActorResources:
    """What one actor asks the cluster for (fractions allowed, as in Ray)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        require(self.num_cpus >= 0, "num_cpus", self.num_cpus, "a number >= 0")
        require(self.num_gpus >= 0, "num_gpus", self.num_gpus, "a number >= 0")

    def bundle(self) -> dict[str, float]:
        """The placement-group bundle for this actor (Ray rejects zero-valued entries)."""
        bundle = {"CPU": self.num_cpus, "GPU": self.num_gpus}
        return {key: value for key, value in bundle.items() if value > 0}


@dataclass
class ModelPaths:
    """`save_pretrained` directories (or hub ids already in the local cache) loaded inside the actors.

    The tokenizers (by default looked for in the model folders themselves) let the engine compare
    the two vocabularies token by token — needed when the embedding tables are padded to different
    sizes (e.g. Qwen2.5-7B's 152064 rows vs 0.5B's 151936 over the same tokenizer).
    """

    target: str = ""
    drafter: str | None = None
    target_tokenizer: str | None = None
    drafter_tokenizer: str | None = None

    def __post_init__(self) -> None:
        require(bool(self.target), "models.target", self.target, "a model path")


@dataclass
class TopologyConfig:
    """How many rollout workers, what each actor gets, and how actors are placed.

    `placement_strategy` is a Ray placement-group strategy over one bundle per worker plus one for
    the learner; `None` places actors without a group. `max_restarts` is per worker: a restarted
    worker reloads the current weights before it serves, and the controller re-sends its work.
    """

    num_workers: int = 1
    worker: ActorResources = field(default_factory=ActorResources)
    learner: ActorResources = field(default_factory=ActorResources)
    placement_strategy: str | None = "PACK"
    max_restarts: int = 3
    max_resends: int = 3

    def __post_init__(self) -> None:
        require(self.num_workers >= 1, "num_workers", self.num_workers, "an int >= 1")
        require(
            self.placement_strategy is None or self.placement_strategy in PLACEMENT_STRATEGIES,
            "placement_strategy", self.placement_strategy, f"one of {PLACEMENT_STRATEGIES} or null",
        )
        require(self.max_restarts >= 0, "max_restarts", self.max_restarts, "an int >= 0 (-1 is not allowed)")
        require(self.max_resends >= 0, "max_resends", self.max_resends, "an int >= 0")


@dataclass
class SyncConfig:
    """Weight sync: transport, bucket size and the bound on how long one sync may take."""

    transport: str = "object_store"
    backend: str = "gloo"
    bucket_mb: float = 64.0
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        require(self.transport in TRANSPORTS, "sync.transport", self.transport, f"one of {TRANSPORTS}")
        require(self.backend in DIST_BACKENDS, "sync.backend", self.backend, f"one of {DIST_BACKENDS}")
        require(self.bucket_mb > 0, "sync.bucket_mb", self.bucket_mb, "a number > 0")
        require(self.timeout_s > 0, "sync.timeout_s", self.timeout_s, "a number > 0")

    @property
    def bucket_bytes(self) -> int:
        return max(1, int(self.bucket_mb * 2**20))


@dataclass
class JobConfig:
    """What `ray_job` does: `rounds` rollout rounds over `num_prompts` synthetic prompts, n samples each."""

    num_prompts: int = 4
    n: int = 2
    prompt_len: int = 8
    rounds: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_prompts", "n", "prompt_len", "rounds"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "an int >= 1")


@dataclass
class RayRunConfig:
    """One Ray rollout run. `address` None means `ray.init()`'s own discovery (embedded or job cluster)."""

    models: ModelPaths = field(default_factory=ModelPaths)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=32))
    sync: SyncConfig = field(default_factory=SyncConfig)
    job: JobConfig = field(default_factory=JobConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    address: str | None = None
    online_learning: bool = True


class ConfigError(ValueError):
    """A config that cannot be used as written: its file, or a field named by its dotted path."""


def load_config(path: str | Path, cls: type[T]) -> T:
    """Read a YAML file into the dataclass `cls` (an empty file gives the defaults); see the module doc."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from err
    return from_dict(cls, {} if data is None else data)


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build the dataclass `cls` from a mapping, each value typed by its field (see the module doc)."""
    label = where or cls.__name__
    if not isinstance(data, dict):
        hint = f" (an emptied section: write `{label}: {{}}` for the defaults)" if data is None else ""
        raise ConfigError(f"{label}={data!r} is invalid: a mapping of {cls.__name__} fields{hint}")
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        raise ConfigError(f"{label} has unknown fields {unknown}; allowed: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _typed(hints[name], value, f"{where}.{name}" if where else name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as err:
        # `__post_init__` checks name their field, some with the section already (`grpo.steps`).
        message = str(err)
        raise ConfigError(message if not where or message.startswith(f"{where}.") else f"{where}: {message}") from err


def _typed(hint: Any, value: Any, where: str) -> Any:
    """`value` as the type `hint` allows it, or a `ConfigError` naming `where`, the value and what is allowed."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return from_dict(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _typed(arg, value, where)
            except ConfigError:
                continue
    elif origin is Literal:
        if any(value == arg and type(value) is type(arg) for arg in args):
            return value
    elif origin is dict or hint is dict:
        if isinstance(value, dict):
            key_hint, value_hint = args or (Any, Any)
            return {_typed(key_hint, k, f"{where} key"): _typed(value_hint, v, f"{where}.{k}")
                    for k, v in value.items()}
    elif origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            return origin(_typed(args[0], item, f"{where}[{i}]") for i, item in enumerate(value))
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, hint):
        return value
    raise ConfigError(f"{where}={value!r} is invalid: {_describe(hint)}")


def _describe(hint: Any) -> str:
    """What a type hint allows, in the words of a config error."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin is Literal:
        return " or ".join(repr(arg) for arg in args)
    if origin in (list, tuple):
        return f"a list (each {_describe(args[0])})"
    if origin is dict or hint is dict:
        return "a mapping"
    names = {bool: "true or false", int: "an int", float: "a number", str: "a string", type(None): "null"}
    return names.get(hint, f"a {getattr(hint, '__name__', hint)}")
