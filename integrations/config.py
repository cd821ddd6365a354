"""Run configuration for the Ray backend, and the YAML loader every specroll config goes through.

One YAML file describes a run: where the models live, how many rollout workers and what each one
gets from the cluster, how they are placed, how weights travel, and the engine / sampling / learner
settings. `load_config(path, RayRunConfig)` turns it into validated dataclasses; any key the
dataclass does not know fails with a `ValueError` naming it, so a typo never silently falls back to
a default. The loader is generic (nested dataclasses, optional fields) and other modules reuse it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

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
    """One Ray rollout run. `address` None means `ray.init()`'s own discovery (embedded or job cluster).

    `learner` holds `LearnerConfig` keyword arguments; it is validated by `LearnerConfig` itself
    inside the learner actor, so this module does not import the online learner.
    """

    models: ModelPaths = field(default_factory=ModelPaths)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=32))
    sync: SyncConfig = field(default_factory=SyncConfig)
    job: JobConfig = field(default_factory=JobConfig)
    learner: dict[str, Any] = field(default_factory=dict)
    address: str | None = None
    online_learning: bool = True


def load_config(path: str | Path, cls: type[T]) -> T:
    """Read a YAML file into the dataclass `cls` (nested dataclasses included); unknown keys fail."""
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    return from_dict(cls, data)


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build `cls` from a mapping, recursing into dataclass-typed fields; rejects unknown keys."""
    label = where or cls.__name__
    if not isinstance(data, dict):
        raise ValueError(f"{label}={data!r} is invalid: a mapping of {cls.__name__} fields")
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{label} has unknown fields {unknown}; allowed: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        nested = _dataclass_in(hints[name])
        child = f"{where}.{name}" if where else name
        kwargs[name] = from_dict(nested, value, child) if nested and isinstance(value, dict) else value
    if "stop_token_ids" in kwargs and isinstance(kwargs["stop_token_ids"], list):
        kwargs["stop_token_ids"] = tuple(kwargs["stop_token_ids"])
    return cls(**kwargs)


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field is typed as (also through `X | None`), or None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if dataclasses.is_dataclass(arg) and isinstance(arg, type):
                return arg
    return None
