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

With a learner, the workers' engines record verification signals (forced: the learner trains on them; a head's
carry the target's hidden states), and every policy sync sends a head's learner the policy's embedding and LM
head (`LearnerActor.policy_names`). A sync waits for workers Ray is restarting, stages, posts on the board and
commits (`sync.protocol`): after it, or after a sync that failed, every worker serves one version.

One service for several trainer ranks (`shared_service`): built with a `namespace`, the controller
names its workers, board and learner there, and `RolloutController.attach` gives another process (rank
> 0 of `accelerate launch`) a controller over those same actors. An attached controller generates on
the shared workers and feeds the shared learner, but never syncs weights, runs learner rounds or kills
the actors: the creating rank does, once per step, and the others `await_policy` the version it synced.

`actors` starts the actors, `learner_driver` drives the rounds (and brings a learner that died back from its
state after its last round), `drafter_events` with `drafter_guard` handles every drafter event — publish, policy
sync, worker or learner restart, resume: each worker's drafter digest against the learner's, the first batch after
it for a collapse (alarm, event, the watchdog's revert). `state_dict` / `load_state_dict` (a resumed run) move the
learner's state, the checks' counts and each worker's engine state (`SpecEngine.state_dict`), and sync the
learner's published drafter to the workers as any new version.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import ray
import torch

from specroll.integrations.backend import LearnerRound, ProbeRequest, name_prompt_ids, raise_for_errors
from specroll.integrations.drafter_watch import DrafterWatch
from specroll.integrations.model_source import trained_drafter_kind
from specroll.integrations.threads import ThreadSetting
from specroll.rollout import Rollout, SamplingParams
from specroll.rollout.core.stats import BatchStats
from specroll.rollout.drafters.version import DrafterVersion

from .actors import ServiceActors, find_actors, start_actors
from .dispatch import run_chunks, split_groups
from .drafter_events import DrafterEvents
from .drafter_guard import DrafterGuard
from .learner_driver import LearnerDriver
from .settings import ControllerConfig
from .sync.payload import DrafterMeta
from .sync.protocol import WeightSyncError, drafter_meta, wait_for_workers
from .sync.sequence import sync_weights
from .sync.transports import make_transport


class RolloutController(DrafterEvents):
    """Spreads prompt groups over `RolloutWorker` actors and drives the `LearnerActor`."""

    def __init__(self, config: ControllerConfig, placement_timeout_s: float = 120.0, namespace: str | None = None):
        """Start the workers, board and learner; with `namespace`, as named actors there (`attach` finds them)."""
        with_learner = _has_learner(config)
        if with_learner:  # the learner lives on what verification records
            config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, record_signals=True))
        self.config, self.namespace, self.owns_actors = config, namespace, True
        self.transport = make_transport(config.sync)
        self.actors = start_actors(config, with_learner, namespace, placement_timeout_s)
        self._init_state()
        if self.learner is not None:
            try:
                self.learner_driver = LearnerDriver(self.learner, max(placement_timeout_s, config.sync.timeout_s))
                self.guard.published(0, ray.get(self.learner.published_digest.remote(config.engine.dtype)))
                self.guard.verify("start", self.workers)
            except BaseException:  # a half-built service must not hold its actors after it (re-raised)
                self.shutdown()
                raise

    @classmethod
    def attach(cls, config: ControllerConfig, namespace: str, timeout_s: float = 120.0) -> RolloutController:
        """A controller over the actors another process's controller created in `namespace` (same `config`).

        Waits up to `timeout_s` for them; raises RuntimeError naming the actor it could not find.
        """
        self = cls.__new__(cls)
        self.config, self.namespace, self.owns_actors = config, namespace, False
        self.transport = None
        self.actors = find_actors(config, _has_learner(config), namespace, timeout_s)
        self._init_state()
        versions = ray.get(self.workers[0].versions.remote(), timeout=timeout_s)
        self.policy_version, self.drafter_version = versions["policy"], versions["drafter"]
        return self

    def _init_state(self) -> None:
        self.policy_version = 0
        self.drafter_version = 0
        self.learner_driver: LearnerDriver | None = None  # the owner's driver of the learner actor
        self.learner_version = 0  # the version the learner publishes (ahead of `drafter_version` after a failed sync)
        self.watch = DrafterWatch()
        self.guard = DrafterGuard(self.watch, self.board, self.config.engine.dtype, self.config.sync.timeout_s)
        self._last_sync_s: dict[str, float] = {}
        self.last_batch = BatchStats()
        self.num_resends = 0
        self.total_rollouts = 0  # returned by generate since the run began (a resumed run's from its checkpoint)

    @property
    def workers(self) -> list[Any]:
        return self.actors.workers

    @property
    def board(self) -> Any:
        return self.actors.board

    @property
    def learner(self) -> Any | None:
        return self.actors.learner

    # ------------------------------------------------------------------ RolloutBackend

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Rollout]:
        """Complete every prompt n times; input order, a prompt's n samples consecutive, one worker each.

        Raises `RolloutError` (carrying every rollout) when any rollout ended with an error."""
        if n < 1:
            raise ValueError(f"n={n!r} is invalid: an int >= 1")
        if self.learner_driver is not None and self.learner_version != self.drafter_version:
            self._publish(self.learner_version, "drafter publish (again: the last sync was refused)")
        if self.config.engine.kind == "vllm" and self.learner is not None:
            self.guard.verify_before_batch(self.workers)
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
            if self.owns_actors:  # awaited with the round this controller queues after them
                self.learner_driver.add(refs)
            else:  # in the shared buffer once this returns: the creating rank's next round sees them
                ray.get(self.learner.add_rollouts.remote(refs))
        self.total_rollouts += len(rollouts)
        total = sum((batch.stats for batch in batches), BatchStats())
        self.last_batch = dataclasses.replace(total, wall_time_s=time.perf_counter() - started)
        if self.learner_driver is not None and not self.learner_driver.running:
            self._check_batches(batches)
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
        names = self.learner_driver.policy_names if self.learner_driver is not None else []
        read = {name: named_tensors[name] for name in names if name in named_tensors}
        if read:  # the learner is idle: its round was collected before this sync
            ray.get(self.learner.load_policy.remote(read), timeout=self.config.sync.timeout_s)
        self.guard.verify(f"policy sync to version {version}", self.workers)
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

    def sync_drafter(self, version: DrafterVersion, digest: str | None = None) -> float:
        """Load drafter `version` on every worker; returns seconds. With `digest` (the learner's,
        `version.digest(engine dtype)`) each worker refuses a version that arrives otherwise: WeightSyncError, the
        version kept."""
        self._require_owner("sync_drafter")
        seconds = self._sync("drafter", version.weights, version.number, digest, drafter_meta(version))
        self.drafter_version = version.number
        return seconds

    def start_learner_round(self, budget_s: float | None, probe: ProbeRequest | None = None) -> None:
        """Queue the probe (rollouts generated by the workers, scored by the learner) and the round."""
        if self.learner is None:
            return
        self._require_owner("start_learner_round")
        probe_refs = None
        if probe is not None:
            chunks = split_groups(len(probe.prompts), len(self.workers))
            probe_refs = [self.workers[i].generate.remote([probe.prompts[j] for j in chunk], probe.params, probe.n,
                                                          list(chunk)) for i, chunk in enumerate(chunks)]
        break_even = self.workers[0].break_even_acceptance.remote()  # resolved by Ray before the round runs
        self.learner_driver.start(budget_s, probe_refs, break_even)

    def finish_learner_round(self, stop: bool = False) -> LearnerRound | None:
        """Wait for the queued round (`stop`: telling it to stop training now); sync its drafter to the workers if
        the version moved. A learner that died meanwhile is brought back from its last state (the round is lost:
        `LearnerRound.report` None)."""
        if self.learner_driver is None:
            return None
        started = time.perf_counter()
        done = self.learner_driver.finish(self.workers[0], stop)
        if done is None:
            return None
        if done.lost is not None:
            self.watch.events.append(done.lost)
            self._after_learner_restart()
        elif done.report.version != self.drafter_version:
            self._publish(done.report.version, "drafter publish")
        return LearnerRound(done.report, done.probe, time.perf_counter() - started, self.watch.take_events())

    def published_drafter(self) -> DrafterVersion | None:
        return None if self.learner is None else ray.get(self.learner.published_drafter.remote())

    def metrics(self) -> dict[str, float]:
        return {"rollout/policy_version": float(self.policy_version), "drafter/version": float(self.drafter_version),
                "rollout/resends": float(self.num_resends), "rollout/total_rollouts": float(self.total_rollouts),
                **self.watch.metrics(), **self._last_sync_s}

    def state_dict(self) -> dict[str, Any]:
        """The learner actor's state (after the rollouts added before this call), the drafter checks' counts,
        each worker's engine state and the rollout count."""
        self._require_owner("state_dict")
        if self.learner_driver is not None and self.learner_driver.running:
            raise RuntimeError("state_dict while a learner round runs: finish_learner_round collects it first")
        timeout = self.config.sync.timeout_s
        learner = None
        if self.learner is not None:  # an actor runs one caller's calls in order: after every add queued
            learner = ray.get(self.learner.state_dict.remote(), timeout=timeout)
        return {"learner": learner, "total_rollouts": self.total_rollouts, "drafter_watch": self.watch.state_dict(),
                "engines": self.engine_states()}

    def engine_states(self) -> list[dict[str, Any]]:
        timeout = self.config.sync.timeout_s
        return ray.get([w.engine_state.remote() for w in wait_for_workers(self.workers, timeout)], timeout=timeout)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the learner actor, the drafter checks' counts and the workers' engine states (by worker index;
        workers beyond the saved ones start afresh) from `state`, and sync the learner's published drafter."""
        self._require_owner("load_state_dict")
        learner = state["learner"]
        if (learner is None) != (self.learner is None):
            raise ValueError(f"the state {'has' if learner is not None else 'has no'} learner and this service "
                             f"{'has' if self.learner is not None else 'has none'}: online_learning and the drafter "
                             "kind must be those of the run that saved it")
        timeout = self.config.sync.timeout_s
        ray.get([w.load_engine_state.remote(engine) for w, engine in zip(self.workers, state.get("engines", []))],
                timeout=timeout)
        if learner is not None:
            self.learner_driver.load(learner)
            self._publish(int(learner["version"]), "resume")
        if "drafter_watch" in state:
            self.watch.load_state_dict(state["drafter_watch"])
        self.total_rollouts = int(state["total_rollouts"])

    def process_threads(self) -> list[ThreadSetting]:
        """The torch threads of every worker and of the learner, as each reports them."""
        actors = [*self.workers, *([self.learner] if self.learner is not None else [])]
        return ray.get([actor.threads.remote() for actor in actors], timeout=self.config.sync.timeout_s)

    def shutdown(self) -> None:
        """Stop the actors this controller created; an attached one only lets go of them."""
        if not self.owns_actors:
            self.actors = ServiceActors(self.board, [], None)
            return
        self.transport.close(self.config.sync.timeout_s)  # the broadcast group, on the workers too
        self.actors.stop()

    # ------------------------------------------------------------------ internals

    def _require_owner(self, method: str) -> None:
        if not self.owns_actors:
            raise RuntimeError(f"{method} on a controller attached to namespace {self.namespace!r}: only the "
                               "controller that created the shared service (rank 0) syncs weights and runs the "
                               "learner; the other ranks await_policy")

    def _count_resend(self) -> None:
        self.num_resends += 1

    def _sync(self, role: str, named_tensors: Mapping[str, torch.Tensor], version: int,
              digest: str | None = None, drafter: DrafterMeta | None = None) -> float:
        seconds = sync_weights(self.transport, self.board, self.workers, role, named_tensors, version,
                               self.config.sync, self.config.engine.dtype, digest, drafter)
        self._last_sync_s[f"sync/{role}_s"] = seconds
        return seconds


def _has_learner(config: ControllerConfig) -> bool:
    return config.learner is not None and trained_drafter_kind(config.models, config.engine) is not None


__all__ = ["RolloutController", "WeightSyncError"]
