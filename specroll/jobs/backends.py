"""From a run config to models on disk and a running rollout backend — shared by `specroll train` and
the Ray job, so one YAML means the same to both.

    sources = resolve_models(config)          # the demo recipe (built on first use, cached) or your folders
    backend = make_backend(config, sources)   # Ray workers (embedded cluster or the job's) or in-process
    ...
    backend.shutdown(); stop_ray()

Under `accelerate launch` (several trainer ranks, `trainer_ranks` not None) the Ray backend is one
service for all ranks (`ray_backend.shared_service`: rank 0 creates it, the others attach); the local
backend is one engine per rank (an engine in one process cannot be shared).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from specroll.integrations.backend import RolloutBackend
from specroll.integrations.model_source import ModelPaths, load_tokenizer, trained_drafter_kind
from specroll.rollout.drafters.registry import DRAFTERS

from .train_config import TrainConfig

logger = logging.getLogger(__name__)

FRESH_HEAD = "fresh"  # models.head: a head from nothing (the cold start), also with the demo's models
# Minutes a first build takes on 2 CPU cores (measured; a faster machine takes less).
BUILD_MINUTES = {"full": 8, "tiny": 1, "bpe": 11, "bpe_tiny": 1, "tiny_heads32": 1}


@dataclass
class ModelSources:
    """Where the rollout engines load the models from; `tokenizer` None when the folders have none;
    `build_s` the seconds this run spent building the demo models (0 when they were cached); `world` the
    demo world whose task the run trains on ("chars" or "bpe", `demo.world`)."""

    paths: ModelPaths
    tokenizer: Any | None
    max_digits: int
    build_s: float = 0.0
    world: str = "chars"


def resolve_models(config: TrainConfig) -> ModelSources:
    """Your `pretrained` folders, or the demo recipe's models — built first, saying so, if not cached."""
    models = config.models
    if models.source == "pretrained":
        paths = ModelPaths(models.target, models.drafter, models.tokenizer or models.target, models.drafter,
                           None if models.head == FRESH_HEAD else models.head)
        tokenizer = load_tokenizer(paths.target_tokenizer)
        if tokenizer is None and models.tokenizer:  # named, not found: never train on without the one you named
            from specroll.integrations.yaml_config import ConfigError

            raise ConfigError(f"models.tokenizer={models.tokenizer!r} is invalid: no tokenizer there (a folder with "
                              "tokenizer.json / tokenizer_config.json, or a locally cached hub id); leave it unset to "
                              "use the target's")
        return ModelSources(paths, tokenizer, models.task_max_digits or 10)
    from specroll.demo.model_cache import is_cached, load_or_build_demo_models, models_dir
    from specroll.demo.recipe import DemoRecipe

    recipe = DemoRecipe.named(models.recipe)
    started = time.perf_counter()
    building = not is_cached(recipe)
    if building:
        logger.info(f"specroll: building the demo models ({models.recipe} recipe, first run only: about "
              f"{BUILD_MINUTES[models.recipe]} min on 2 CPU cores) into {models_dir(recipe)} "
              "($SPECROLL_CACHE); later runs load them from there")
    demo = load_or_build_demo_models(recipe)
    tokenizer_dir = str(demo.path / "tokenizer")
    drafter_dir = demo.path / "drafter"
    if models.drafter == "generic":
        from specroll.demo.generic import load_or_build_generic_drafter

        drafter_dir = load_or_build_generic_drafter(demo)
    paths = ModelPaths(str(demo.path / "target"), str(drafter_dir), tokenizer_dir, tokenizer_dir)
    kind = trained_drafter_kind(paths, config.engine)
    if kind is not None and DRAFTERS[kind].is_head and models.head != FRESH_HEAD:
        first = demo_head(demo, kind, models.recipe) if kind in ("eagle", "medusa") else models.head  # the two built
        paths = dataclasses.replace(paths, head=first)
    return ModelSources(paths, demo.tokenizer, models.task_max_digits or recipe.max_digits,
                        time.perf_counter() - started if building else 0.0, recipe.world)


def demo_head(demo: Any, kind: str, recipe: str) -> str:
    """The demo target's `kind` head's first version (trained offline from the target's own samples on
    first use, saying so, and cached next to the demo models: `demo.heads`); its file path."""
    from specroll.demo.heads import HeadTrainingSettings, heads_dir, load_or_train_heads, training_prompts

    path = heads_dir(demo.path) / f"{kind}.pt"
    if not path.is_file():
        settings = HeadTrainingSettings()
        logger.info(f"specroll: training the demo target's {kind} head's first version ({recipe} recipe, first run "
              f"only: ~6 min sampling, then {settings.budget_s(kind) / 60:.0f} min training on 2 CPU cores) into "
              f"{path.parent}")
        prompts = training_prompts(demo.tokenizer, settings.prompts)
        load_or_train_heads(demo.target, prompts, (demo.tokenizer.eos_token_id,), demo.path, settings, (kind,))
    return str(path)


def driver_threads(config: TrainConfig) -> int:
    """The torch threads of the driver (TRL's trainer): `torch_threads`, else this machine's cores less the
    whole CPUs the Ray actors were given (they may share this machine), at least one."""
    if config.torch_threads:
        return config.torch_threads
    cores = os.cpu_count() or 1
    if config.backend.kind == "ray":
        topo = config.backend.topology
        actors = topo.num_workers * topo.worker.num_cpus + (topo.learner.num_cpus if config.online_learning else 0)
        cores -= int(actors)
    return max(1, cores)


def trainer_ranks(config: TrainConfig) -> Any | None:
    """The trainer's process group (`AccelerateRanks`) when a launcher started several ranks, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    from specroll.integrations.trl_hook.ranks import AccelerateRanks

    return AccelerateRanks(cpu=config.engine.device == "cpu", deepspeed=config.grpo.deepspeed is not None)


def make_backend(config: TrainConfig, sources: ModelSources, ranks: Any | None = None) -> RolloutBackend:
    """The config's backend on `sources`; each backend records learning signals itself when it has a learner.

    With `ranks` (several trainer ranks), the Ray backend is one service shared by them all."""
    # An engine that speculates only once it pays needs each drafter version's held-out acceptance with it.
    learner = dataclasses.replace(config.learner, temperature=config.grpo.temperature,
                                  publish_acceptance=config.engine.speculation == "when_learned")
    trained = trained_drafter_kind(sources.paths, config.engine) is not None
    learner = learner if config.online_learning and trained else None
    if config.engine.kind == "vllm" and config.backend.kind == "local":
        from transformers import AutoModelForCausalLM

        from specroll.integrations.model_source import load_drafter, tokenizer_pair
        from specroll.integrations.vllm.backend import VllmBackend

        paths = sources.paths
        target = AutoModelForCausalLM.from_pretrained(paths.target)
        return VllmBackend.from_models(target, load_drafter(paths, config.engine, target), config.engine, learner,
                                       *tokenizer_pair(paths), settings=config.vllm)
    if config.backend.kind == "local":
        from transformers import AutoModelForCausalLM

        from specroll.integrations.local_backend import LocalBackend
        from specroll.integrations.model_source import load_drafter, tokenizer_pair

        paths = sources.paths
        target = AutoModelForCausalLM.from_pretrained(paths.target)
        return LocalBackend.from_models(target, load_drafter(paths, config.engine, target), config.engine,
                                        learner, *tokenizer_pair(paths))
    from specroll.integrations.ray_backend.controller import RolloutController
    from specroll.integrations.ray_backend.settings import ControllerConfig

    controller_config = ControllerConfig(sources.paths, config.engine, config.backend.topology, config.backend.sync,
                                         learner, config.vllm)
    if ranks is not None:
        from specroll.integrations.ray_backend.shared_service import shared_controller

        return shared_controller(controller_config, ranks, connect=lambda: start_ray(config))
    start_ray(config)
    return RolloutController(controller_config)


def start_ray(config: TrainConfig) -> str:
    """Join the cluster of `ray job submit` (its RAY_ADDRESS) or `backend.address`, else start an embedded,
    loopback-only cluster with Ray's token auth on (`ray_backend.cluster` says why it is safe); returns which."""
    import ray

    from specroll.integrations.ray_backend.cluster import connect_ray

    topo = config.backend.topology
    cpus = topo.num_workers * topo.worker.num_cpus + (topo.learner.num_cpus if config.online_learning else 0)
    num_cpus = max(int(cpus + 0.999), 1)
    where = connect_ray(config.backend.address, num_cpus, log_to_driver=False)
    if where == "joined":
        logger.info(f"specroll: joined the Ray cluster at {ray.get_runtime_context().gcs_address}")
    else:
        logger.info(f"specroll: started an embedded Ray cluster ({num_cpus} CPUs, 127.0.0.1 only)")
    return where


def stop_ray() -> None:
    """Shut down the embedded cluster; in a joined cluster (a Ray job) this disconnects the driver only."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
