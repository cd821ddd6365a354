"""LearnerDriver: the controller's side of the `LearnerActor` — rollouts handed over, rounds queued and collected,
the learner's state kept after every round, and the learner brought back from it when its actor died.

    driver = LearnerDriver(learner_actor, timeout_s=60)
    driver.add(batch_refs)                          # after every generate: refs to the workers' batches
    driver.start(budget_s, probe_refs, break_even)  # returns at once; the round runs on the actor
    done = driver.finish(policy_source)             # a `CollectedRound`; `lost` says why when the learner died

Each round is queued with a `state_dict` call behind it: an actor runs one caller's calls in order, so that state
is the learner's right after the round, and as the return value of a call this controller made, the controller
owns it and it outlives the actor's process. When the actor dies (killed, OOM, its node lost) Ray restarts it
(`max_restarts`), and `finish` loads the last whole state into it, sends a head learner the served policy's
tensors it reads (from a worker), and adds again every rollout batch given since that state: the learner loses
the round in flight, never a rollout, and the workers go on serving the drafter they have. Rollouts another
trainer rank added to a shared learner directly (`RolloutController.attach`) are not re-added.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from . import round_stop
from .sync.protocol import RESTART_PROBE_INTERVAL_S


@dataclass
class CollectedRound:
    """A round `finish` collected: the learner's report and probe, or (the learner died) `lost`, why not."""

    report: Any = None
    probe: Any = None
    lost: str | None = None


class LearnerDriver:
    def __init__(self, actor: Any, timeout_s: float):
        self.actor = actor
        self.timeout_s = timeout_s
        self.policy_names: list[str] = ray.get(actor.policy_names.remote(), timeout=timeout_s)
        self.restorable: bool = ray.get(actor.restorable.remote(), timeout=timeout_s)  # a recording is not
        self.pending_adds: list[ray.ObjectRef] = []  # awaited with the round queued after them
        self.unsaved: list[list[ray.ObjectRef]] = []  # batches given since `state` was taken
        self.in_round: list[list[ray.ObjectRef]] = []  # those the running round's state will hold
        self.state: ray.ObjectRef | None = None  # the learner's state after its last collected round
        # (adds, probe, round, state, sentinel) in flight between `start` and `finish`, and the round's stop key
        self._round: tuple[list[ray.ObjectRef], ray.ObjectRef | None, ray.ObjectRef, ray.ObjectRef | None,
                           ray.ObjectRef] | None = None
        self._stop_key: str | None = None

    @property
    def running(self) -> bool:
        return self._round is not None

    def add(self, batch_refs: list[ray.ObjectRef]) -> None:
        """Give the learner a generate call's batches (refs); awaited with the next round."""
        self.pending_adds.append(self.actor.add_rollouts.remote(batch_refs))
        self.unsaved.append(batch_refs)

    def start(self, budget_s: float | None, probe_refs: list[ray.ObjectRef] | None, break_even: Any) -> None:
        """Queue the probe (refs to the workers' probe batches), the round and the state after it."""
        if self._round is not None:
            raise RuntimeError("start_learner_round called twice: finish_learner_round collects the running round")
        adds, self.pending_adds = self.pending_adds, []
        self.in_round, self.unsaved = self.unsaved, []
        probe = self.actor.probe.remote(probe_refs) if probe_refs is not None else None
        self._stop_key = round_stop.new_key()
        round_ref = self.actor.train_round.remote(budget_s, break_even, self._stop_key)
        state = self.actor.state_dict.remote() if self.restorable else None
        self._round = (adds, probe, round_ref, state, self.actor.counts.remote())  # counts: the state is whole

    def finish(self, policy_source: Any, stop: bool = False) -> CollectedRound | None:
        """Wait for the queued round (None if none) — `stop`: after telling it to stop training now
        (`round_stop`) —; if the learner died meanwhile, bring it back from its last state (`policy_source`: a
        worker whose served policy a head learner reads) and say so in `lost`."""
        if self._round is None:
            return None
        adds, probe_ref, round_ref, state, sentinel = self._round
        self._round, key, self._stop_key = None, self._stop_key, None
        if stop:
            round_stop.request_stop(key)
        try:
            return self._collect(policy_source, adds, probe_ref, round_ref, state, sentinel)
        finally:
            if stop:
                round_stop.forget(key)

    def _collect(self, policy_source: Any, adds: list[ray.ObjectRef], probe_ref: ray.ObjectRef | None,
                 round_ref: ray.ObjectRef, state: ray.ObjectRef | None, sentinel: ray.ObjectRef) -> CollectedRound:
        try:
            ray.get(adds)  # a failed add raises here, not silently
            report = ray.get(round_ref)
            probe = ray.get(probe_ref) if probe_ref is not None else None
            ray.get(sentinel)
        except (RayActorError, ActorUnavailableError) as err:
            self.unsaved = self.in_round + self.unsaved
            self.in_round = []
            return CollectedRound(lost=self.recover(policy_source, err))
        self.in_round = []
        if state is not None:
            self.state = state
        return CollectedRound(report, probe)

    def recover(self, policy_source: Any, err: Exception) -> str:
        """Wait for Ray to restart the learner, load its last state and the rollouts since; returns the event.
        Raises RuntimeError when Ray will not restart it (its `max_restarts` spent)."""
        self.pending_adds = []
        self._wait_restarted(err)
        if self.state is not None:
            ray.get(self.actor.load_state_dict.remote(self.state), timeout=self.timeout_s)
        if self.policy_names:  # a head reads the policy the workers serve, not the one it was started with
            ray.get(self.actor.load_policy.remote(policy_source.served_policy.remote(self.policy_names)),
                    timeout=self.timeout_s)
        for batch_refs in self.unsaved:
            ray.get(self.actor.add_rollouts.remote(batch_refs), timeout=self.timeout_s)
        where = "its state after the last round" if self.state is not None else "its start (no round collected yet)"
        return (f"learner actor lost ({type(err).__name__}); restarted from {where} with the "
                f"{len(self.unsaved)} rollout batches since: the round in flight is lost, the workers kept "
                "serving their drafter")

    def load(self, state: dict[str, Any]) -> None:
        """Restore the learner from a saved state (a resumed run); it is also the state a restart goes back to."""
        self.state = ray.put(state)
        self.unsaved = []
        ray.get(self.actor.load_state_dict.remote(self.state), timeout=self.timeout_s)

    def _wait_restarted(self, err: Exception) -> None:
        deadline = time.monotonic() + self.timeout_s
        died_once = False
        while True:
            try:
                ray.get(self.actor.counts.remote(), timeout=max(0.0, deadline - time.monotonic()))
                return
            except GetTimeoutError as timeout:
                raise RuntimeError(f"the learner actor did not answer within {self.timeout_s}s") from timeout
            except ActorUnavailableError:
                died_once = False
            except RayActorError as again:
                if died_once:  # a second failure after the first: Ray has given it up
                    raise RuntimeError("the learner actor died and Ray will not restart it (its max_restarts are "
                                       "spent); the run cannot learn on") from again
                died_once = True
            if time.monotonic() > deadline:
                raise RuntimeError(f"the learner actor still restarting after {self.timeout_s}s") from err
            time.sleep(RESTART_PROBE_INTERVAL_S)
