"""Settings of the Ray rollout service: what each actor gets from the cluster, how actors are placed,
and how weights travel (the `backend` section of a run config, `specroll.jobs.train_config`), and
the `ControllerConfig` a controller is built from. No Ray import: a config loads without Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specroll.integrations.model_source import ModelPaths
from specroll.integrations.vllm.settings import VllmSettings
from specroll.online_drafter import LearnerConfig
from specroll.rollout import EngineConfig
from specroll.rollout.config import require

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
class TopologyConfig:
    """How many rollout workers, what each actor gets, and how actors are placed.

    `placement_strategy` is a Ray placement-group strategy over one bundle per worker plus one for
    the learner; `None` places actors without a group. `max_restarts` is per actor, each worker's and the
    learner's: a restarted worker reloads the current weights before it serves, and the controller re-sends its
    work; a restarted learner is loaded with its state after its last round and the rollouts since.
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
class ControllerConfig:
    """What a `RolloutController` serves: the models, each worker's engine, the topology and weight
    transport, and the online learner (None: the drafter stays as loaded). Built by the jobs from the
    run config (`specroll.jobs.backends.make_backend`), or directly in code."""

    models: ModelPaths
    engine: EngineConfig = field(default_factory=EngineConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    learner: LearnerConfig | None = None
    vllm: VllmSettings = field(default_factory=VllmSettings)  # each worker's vLLM engine (engine.kind: vllm)
