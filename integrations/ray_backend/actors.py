"""The actors of one Ray rollout service, started (or found) together: weight board, rollout workers, learner.

    actors = start_actors(config, with_learner=True, namespace=None, placement_timeout_s=120)
    ...
    actors.stop()                                      # every actor, and the placement group

`start_actors` places one bundle per worker plus one for the learner in a placement group (when the topology
names a strategy and every bundle asks for something), starts the workers and the learner with
`max_restarts` (a restarted worker reloads the current weights from the board; a restarted learner is brought
back from its last state by `learner_driver`), and waits until every worker and the board answer — a
half-built service is stopped before the error is raised. `find_actors` looks the same actors up by name in a
namespace (`shared_service`: another trainer rank's controller).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from specroll.integrations.threads import actor_threads

from .learner_actor import LearnerActor
from .service_names import BOARD_NAME, LEARNER_NAME, lookup_actor, named, worker_name
from .settings import ControllerConfig
from .sync.board import WeightBoard
from .sync.protocol import ObjectStoreTransport, pack_buckets
from .worker import RolloutWorker


@dataclass
class ServiceActors:
    """The board, the workers (index order), the learner (None without one) and the placement group."""

    board: Any
    workers: list[Any]
    learner: Any | None
    placement_group: Any | None = None

    def stop(self) -> None:
        """Kill every actor (no restart) and remove the placement group."""
        for actor in [*self.workers, self.learner, self.board]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None


def start_actors(config: ControllerConfig, with_learner: bool, namespace: str | None,
                 placement_timeout_s: float) -> ServiceActors:
    """Start and wait for the service's actors (see the module doc); RuntimeError naming what did not start."""
    topo = config.topology
    board = WeightBoard.options(**named(BOARD_NAME, namespace)).remote()
    bundles = [topo.worker.bundle()] * topo.num_workers + ([topo.learner.bundle()] if with_learner else [])
    group = None
    if topo.placement_strategy is not None and all(bundles):
        group = placement_group(bundles, strategy=topo.placement_strategy)
        try:
            ray.get(group.ready(), timeout=placement_timeout_s)
        except GetTimeoutError as err:
            remove_placement_group(group)
            raise RuntimeError(f"placement group {bundles} ({topo.placement_strategy}) not placed within "
                               f"{placement_timeout_s}s; cluster has {ray.cluster_resources()}") from err

    def bundle(index: int) -> PlacementGroupSchedulingStrategy | None:
        return None if group is None else PlacementGroupSchedulingStrategy(placement_group=group,
                                                                           placement_group_bundle_index=index)

    workers = [
        RolloutWorker.options(
            num_cpus=topo.worker.num_cpus, num_gpus=topo.worker.num_gpus, max_restarts=topo.max_restarts,
            max_task_retries=0, scheduling_strategy=bundle(i), **named(worker_name(i), namespace),
        ).remote(i, config.models, config.engine, board, config.sync.timeout_s, actor_threads(topo.worker.num_cpus),
                  config.vllm)
        for i in range(topo.num_workers)
    ]
    learner = None
    if with_learner:
        learner = LearnerActor.options(
            num_cpus=topo.learner.num_cpus, num_gpus=topo.learner.num_gpus, max_restarts=topo.max_restarts,
            max_task_retries=0, scheduling_strategy=bundle(topo.num_workers), **named(LEARNER_NAME, namespace),
        ).remote(config.models, config.engine, config.learner, actor_threads(topo.learner.num_cpus))
    actors = ServiceActors(board, workers, learner, group)
    warm_up = ObjectStoreTransport().publish(*pack_buckets({"warm_up": torch.zeros(1)}, 1 << 10, version=-1), 0)
    try:
        ray.get([w.versions.remote() for w in workers] + [board.ping.remote(warm_up)], timeout=placement_timeout_s)
    except GetTimeoutError as err:
        message = (f"{topo.num_workers} rollout workers ({topo.worker}) not all started within "
                   f"{placement_timeout_s}s; cluster resources {ray.cluster_resources()}, available "
                   f"{ray.available_resources()}")
        actors.stop()  # a half-built service must not hold its actors and placement group after it
        raise RuntimeError(message) from err
    return actors


def find_actors(config: ControllerConfig, with_learner: bool, namespace: str, timeout_s: float) -> ServiceActors:
    """The actors another process's controller started in `namespace`; RuntimeError naming one not found."""
    names = [worker_name(i) for i in range(config.topology.num_workers)] + [BOARD_NAME]
    found = [lookup_actor(name, namespace, timeout_s) for name in names]
    learner = lookup_actor(LEARNER_NAME, namespace, timeout_s) if with_learner else None
    return ServiceActors(found[-1], found[:-1], learner)
