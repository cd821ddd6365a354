"""RolloutController: the Ray `RolloutBackend` — rollout workers, a draft learner and weight sync.

Usage (in the driver: the trainer's process or `ray_job`)::

    controller = RolloutController(ControllerConfig(ModelPaths(target_dir, drafter_dir), learner=LearnerConfig()))
    rollouts = controller.generate(prompts, SamplingParams(max_new_tokens=64), n=8)
    controller.sync_policy(policy.state_dict(), version=1)
    controller.start_learner_round(budget_s=5.0)     # runs on the learner actor; returns at once
    done = controller.finish_learner_round()         # before the next rollout: publishes if it moved

`generate` cuts the prompts into one chunk of whole groups (all n samples of a prompt) per worker (`dispatch`), so
siblings share an engine, and hands chunks to idle workers. A chunk whose worker died is re-sent —
to the restarted worker or to another idle one — and its result is kept exactly once, so every
prompt gets exactly n completions in input order. Restarted workers reload the current weights from
the `WeightBoard` before serving; every rollout is checked to carry the current policy version.

With a learner, the workers' engines record verification signals (forced here: the learner trains
on them; for an EAGLE / Medusa head they carry the target's hidden states too). A head's learner reads
the policy's embedding and LM head: every policy sync sends it those tensors (`LearnerActor.policy_names`).
A sync waits for workers Ray is restarting, then stages, posts on the board and commits (see
`sync.protocol`): after it, or after a sync that failed, every worker serves one version.

One service for several trainer ranks (`shared_service`): built with a `namespace`, the controller
names its workers, board and learner there, and `RolloutController.attach` gives another process (rank
> 0 of `accelerate launch`) a controller over those same actors. An attached controller generates on
the shared workers and feeds the shared learner, but never syncs weights, runs learner rounds or kills
the actors: the creating rank does, once per step, and the others `await_policy` the version it synced.

A resumed run (`state_dict` / `load_state_dict`) moves the learner's state (`online_drafter.learner_state`)
between the learner actor and the driver with Ray's `__ray_call__` (a function run on the actor with the
actor as its argument: `LearnerActor` has no methods of its own for it yet), and syncs its published
drafter to the workers as any new version.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from specroll.integrations.backend import LearnerRound, ProbeRequest, name_prompt_ids, raise_for_errors
from specroll.integrations.model_source import trained_drafter_kind
from specroll.integrations.threads import ThreadSetting, actor_threads
from specroll.online_drafter.learner_state import restore, state_of
from specroll.rollout import Rollout, SamplingParams
from specroll.rollout.core.stats import BatchStats

from .dispatch import run_chunks, split_groups
from .learner_actor import LearnerActor
from .service_names import BOARD_NAME, LEARNER_NAME, lookup_actor, named, worker_name
from .settings import ControllerConfig
from .sync.board import WeightBoard
from .sync.protocol import (
    ObjectStoreTransport,
    WeightSyncError,
    commit_weights,
    discard_staged,
    make_transport,
    pack_buckets,
    stage_weights,
    wait_for_workers,
)
from .worker import RolloutWorker


class RolloutController:
    """Spreads prompt groups over `RolloutWorker` actors and drives the `LearnerActor`."""

    def __init__(self, config: ControllerConfig, placement_timeout_s: float = 120.0, namespace: str | None = None):
        """Start the workers, board and learner; with `namespace`, as named actors there (`attach` finds them)."""
        with_learner = _has_learner(config)
        if with_learner:  # the learner lives on what verification records
            config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, record_signals=True))
        self.config = config
        topo = config.topology
        self.transport = make_transport(config.sync)
        self.namespace = namespace
        self.owns_actors = True
        self.board = WeightBoard.options(**named(BOARD_NAME, namespace)).remote()
        bundles = [topo.worker.bundle()] * topo.num_workers + ([topo.learner.bundle()] if with_learner else [])
        self.placement_group = None
        if topo.placement_strategy is not None and all(bundles):
            self.placement_group = placement_group(bundles, strategy=topo.placement_strategy)
            try:
                ray.get(self.placement_group.ready(), timeout=placement_timeout_s)
            except GetTimeoutError as err:
                remove_placement_group(self.placement_group)
                raise RuntimeError(f"placement group {bundles} ({topo.placement_strategy}) not placed within "
                                   f"{placement_timeout_s}s; cluster has {ray.cluster_resources()}") from err
        self.workers = [
            RolloutWorker.options(
                num_cpus=topo.worker.num_cpus, num_gpus=topo.worker.num_gpus, max_restarts=topo.max_restarts,
                max_task_retries=0, scheduling_strategy=self._bundle(i), **named(worker_name(i), namespace),
            ).remote(i, config.models, config.engine, self.board, config.sync.timeout_s,
                     actor_threads(topo.worker.num_cpus))
            for i in range(topo.num_workers)
        ]
        self.learner = None
        if with_learner:
            self.learner = LearnerActor.options(
                num_cpus=topo.learner.num_cpus, num_gpus=topo.learner.num_gpus,
                scheduling_strategy=self._bundle(topo.num_workers), **named(LEARNER_NAME, namespace),
            ).remote(config.models, config.engine, config.learner, actor_threads(topo.learner.num_cpus))
        warm_up = ObjectStoreTransport().publish(*pack_buckets({"warm_up": torch.zeros(1)}, 1 << 10, version=-1), 0)
        try:
            ray.get([w.versions.remote() for w in self.workers] + [self.board.ping.remote(warm_up)],
                    timeout=placement_timeout_s)
        except GetTimeoutError as err:
            message = (f"{topo.num_workers} rollout workers ({topo.worker}) not all started within "
                       f"{placement_timeout_s}s; cluster resources {ray.cluster_resources()}, available "
                       f"{ray.available_resources()}")
            self.shutdown()  # a half-built service must not hold its actors and placement group after it
            raise RuntimeError(message) from err
        self._init_state()
        if self.learner is not None:
            self._learner_policy_names = ray.get(self.learner.policy_names.remote(), timeout=placement_timeout_s)

    @classmethod
    def attach(cls, config: ControllerConfig, namespace: str, timeout_s: float = 120.0) -> RolloutController:
        """A controller over the actors another process's controller created in `namespace` (same `config`).

        Waits up to `timeout_s` for them; raises RuntimeError naming the actor it could not find.
        """
        with_learner = _has_learner(config)
        self = cls.__new__(cls)
        self.config, self.namespace, self.owns_actors = config, namespace, False
        self.transport, self.placement_group = None, None
        names = [worker_name(i) for i in range(config.topology.num_workers)] + [BOARD_NAME]
        actors = [lookup_actor(name, namespace, timeout_s) for name in names]
        self.workers, self.board = actors[:-1], actors[-1]
        self.learner = lookup_actor(LEARNER_NAME, namespace, timeout_s) if with_learner else None
        self._init_state()
        versions = ray.get(self.workers[0].versions.remote(), timeout=timeout_s)
        self.policy_version, self.drafter_version = versions["policy"], versions["drafter"]
        return self

    def _init_state(self) -> None:
        self.policy_version = 0
        self.drafter_version = 0
        self._pending_learner_adds: list[ray.ObjectRef] = []
        # (buffer adds, probe, round) in flight between start_ and finish_learner_round
        self._round: tuple[list[ray.ObjectRef], ray.ObjectRef | None, ray.ObjectRef] | None = None
        self._last_sync_s: dict[str, float] = {}
        self._learner_policy_names: list[str] = []  # the policy tensors the learner reads (a head's)
        self.last_batch = BatchStats()
        self.num_resends = 0
        self.total_rollouts = 0  # returned by generate since the run began (a resumed run's from its checkpoint)

    # ------------------------------------------------------------------ RolloutBackend

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Rollout]:
        """Complete every prompt n times; input order, a prompt's n samples consecutive, one worker each.

        Raises `RolloutError` (carrying every rollout) when any rollout ended with an error."""
        if n < 1:
            raise ValueError(f"n={n!r} is invalid: an int >= 1")
        started = time.perf_counter()
        chunks = split_groups(len(prompts), len(self.workers))
        results = run_chunks(self.workers, chunks, prompts, params, n, self.config.topology.max_resends,
                             self._count_resend)
        batches = [results[chunk_id][1] for chunk_id in range(len(chunks))]
        rollouts = [r for batch in batches for r in batch.rollouts]
        stale = {r.policy_version for r in rollouts} - {self.policy_version}
        if stale:
            raise RuntimeError(f"rollouts from policy versions {sorted(stale)}; current is {self.policy_version}")
        if self.learner is not None:
            refs = [results[chunk_id][0] for chunk_id in range(len(chunks))]
            added = self.learner.add_rollouts.remote(refs)
            if self.owns_actors:  # awaited with the round this controller queues after them
                self._pending_learner_adds.append(added)
            else:  # in the shared buffer once this returns: the creating rank's next round sees them
                ray.get(added)
        self.total_rollouts += len(rollouts)
        total = sum((batch.stats for batch in batches), BatchStats())
        self.last_batch = dataclasses.replace(total, wall_time_s=time.perf_counter() - started)
        raise_for_errors(rollouts, name_prompt_ids(prompts, n))
        return rollouts

    def batch_stats(self) -> BatchStats:
        """The workers' batches of the last `generate` call summed; `wall_time_s` the call's wall clock."""
        return self.last_batch

    def serves_all_ranks(self) -> bool:
        """True for a service in a namespace: one set of workers and one learner for every trainer rank."""
        return self.namespace is not None

    def sync_policy(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> float:
        """Load new policy weights on every worker; returns seconds. Raises WeightSyncError (versions kept)."""
        self._require_owner("sync_policy")
        seconds = self._sync("policy", named_tensors, version)
        self.policy_version = version
        read = {name: named_tensors[name] for name in self._learner_policy_names if name in named_tensors}
        if read:  # the learner is idle: its round was collected before this sync
            ray.get(self.learner.load_policy.remote(read), timeout=self.config.sync.timeout_s)
        return seconds

    def await_policy(self, version: int, timeout_s: float | None = None) -> None:
        """Check that every live shared worker serves policy `version` (synced by the creating rank) and
        serve it from here on. Raises WeightSyncError naming the versions found when one does not."""
        timeout_s = timeout_s or self.config.sync.timeout_s
        live = wait_for_workers(self.workers, timeout_s)
        versions = ray.get([w.versions.remote() for w in live], timeout=timeout_s)
        served = sorted({v["policy"] for v in versions})
        if served != [version]:
            raise WeightSyncError(f"the shared rollout service serves policy versions {served}, not {version}: "
                                  "the rank that syncs did not sync this step's policy to every worker")
        self.policy_version, self.drafter_version = version, versions[0]["drafter"]

    def sync_drafter(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> float:
        """Load new drafter weights on every worker; returns seconds."""
        self._require_owner("sync_drafter")
        seconds = self._sync("drafter", named_tensors, version)
        self.drafter_version = version
        return seconds

    def start_learner_round(self, budget_s: float | None, probe: ProbeRequest | None = None) -> None:
        """Queue the probe (rollouts generated by the workers, scored by the learner) and the round."""
        if self.learner is None:
            return
        self._require_owner("start_learner_round")
        if self._round is not None:
            raise RuntimeError("start_learner_round called twice: finish_learner_round collects the running round")
        probe_ref = None
        if probe is not None:
            chunks = split_groups(len(probe.prompts), len(self.workers))
            refs = [self.workers[i].generate.remote([probe.prompts[j] for j in chunk], probe.params, probe.n,
                                                    list(chunk)) for i, chunk in enumerate(chunks)]
            probe_ref = self.learner.probe.remote(refs)
        break_even = self.workers[0].break_even_acceptance.remote()  # resolved by Ray before the round runs
        adds, self._pending_learner_adds = self._pending_learner_adds, []  # ordered before the round on the actor
        self._round = (adds, probe_ref, self.learner.train_round.remote(budget_s, break_even))

    def finish_learner_round(self) -> LearnerRound | None:
        """Wait for the queued round; sync its drafter to the workers if the version moved."""
        if self._round is None:
            return None
        started = time.perf_counter()
        adds, probe_ref, round_ref = self._round
        self._round = None
        ray.get(adds)  # a failed add raises here, not silently
        report = ray.get(round_ref)
        probe = ray.get(probe_ref) if probe_ref is not None else None
        if report.version != self.drafter_version:
            self.sync_drafter(ray.get(self.learner.published_state_dict.remote()), report.version)
        return LearnerRound(report, probe, time.perf_counter() - started)

    def published_drafter(self) -> dict[str, torch.Tensor] | None:
        return None if self.learner is None else ray.get(self.learner.published_state_dict.remote())

    def metrics(self) -> dict[str, float]:
        return {"rollout/policy_version": float(self.policy_version), "drafter/version": float(self.drafter_version),
                "rollout/resends": float(self.num_resends), "rollout/total_rollouts": float(self.total_rollouts),
                **self._last_sync_s}

    def state_dict(self) -> dict[str, Any]:
        """The learner actor's state (after the rollouts added before this call) and the rollout count."""
        self._require_owner("state_dict")
        if self._round is not None:
            raise RuntimeError("state_dict while a learner round runs: finish_learner_round collects it first")
        learner = None
        if self.learner is not None:  # an actor runs one caller's calls in order: after every add queued
            learner = ray.get(self.learner.__ray_call__.remote(_learner_state), timeout=self.config.sync.timeout_s)
        return {"learner": learner, "total_rollouts": self.total_rollouts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the learner actor from `state` and sync its published drafter to every worker."""
        self._require_owner("load_state_dict")
        learner = state["learner"]
        if (learner is None) != (self.learner is None):
            raise ValueError(f"the state {'has' if learner is not None else 'has no'} learner and this service "
                             f"{'has' if self.learner is not None else 'has none'}: online_learning and the drafter "
                             "kind must be those of the run that saved it")
        if learner is not None:
            ray.get(self.learner.__ray_call__.remote(_load_learner_state, learner), timeout=self.config.sync.timeout_s)
            self.sync_drafter(ray.get(self.learner.published_state_dict.remote()), int(learner["version"]))
        self.total_rollouts = int(state["total_rollouts"])

    def process_threads(self) -> list[ThreadSetting]:
        """The torch threads of every worker and of the learner, as each reports them."""
        actors = [*self.workers, *([self.learner] if self.learner is not None else [])]
        return ray.get([actor.threads.remote() for actor in actors], timeout=self.config.sync.timeout_s)

    def shutdown(self) -> None:
        """Stop the actors this controller created; an attached one only lets go of them."""
        if not self.owns_actors:
            self.workers, self.learner = [], None
            return
        self.transport.close(self.config.sync.timeout_s)  # the broadcast group, on the workers too
        for actor in [*self.workers, self.learner, self.board]:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        if self.placement_group is not None:
            remove_placement_group(self.placement_group)
            self.placement_group = None

    # ------------------------------------------------------------------ internals

    def _require_owner(self, method: str) -> None:
        if not self.owns_actors:
            raise RuntimeError(f"{method} on a controller attached to namespace {self.namespace!r}: only the "
                               "controller that created the shared service (rank 0) syncs weights and runs the "
                               "learner; the other ranks await_policy")

    def _bundle(self, index: int) -> PlacementGroupSchedulingStrategy | None:
        if self.placement_group is None:
            return None
        return PlacementGroupSchedulingStrategy(placement_group=self.placement_group,
                                                placement_group_bundle_index=index)

    def _count_resend(self) -> None:
        self.num_resends += 1

    def _sync(self, role: str, named_tensors: Mapping[str, torch.Tensor], version: int) -> float:
        """Wait for restarting workers, stage on all, post on the board (the commit point), commit on all.

        Each phase waits at most `sync.timeout_s`. A failure before the commit point raises
        WeightSyncError and changes nothing; after it, every worker ends on `version` (one that cannot
        load it is restarted, and reloads it from the board). Workers Ray gave up restarting are skipped.
        """
        started = time.perf_counter()
        sync = self.config.sync
        live = wait_for_workers(self.workers, sync.timeout_s)
        buckets, layout = pack_buckets(named_tensors, sync.bucket_bytes, version, wire_dtype=self.config.engine.dtype)
        payload = stage_weights(self.transport, live, role, buckets, layout, sync.timeout_s)  # the board's payload
        try:
            ray.get(self.board.post.remote(role, payload), timeout=sync.timeout_s)
        except RayError as err:
            discard_staged(live, role)
            raise WeightSyncError(f"{role} version {version} could not be posted on the weight board: {err}") from err
        commit_weights(live, role, payload, sync.timeout_s)
        seconds = time.perf_counter() - started
        self._last_sync_s[f"sync/{role}_s"] = seconds
        return seconds


def _learner_state(actor: LearnerActor) -> dict[str, Any]:
    """Run on the learner actor (`__ray_call__`): its learner's state."""
    return state_of(actor.learner)


def _load_learner_state(actor: LearnerActor, state: dict[str, Any]) -> None:
    """Run on the learner actor (`__ray_call__`): restore its learner from `state`."""
    restore(actor.learner, state, "the saved learner state")


def _has_learner(config: ControllerConfig) -> bool:
    return config.learner is not None and trained_drafter_kind(config.models, config.engine) is not None


__all__ = ["RolloutController", "WeightSyncError"]
