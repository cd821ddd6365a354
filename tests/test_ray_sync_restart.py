"""A policy sync that meets a restarting worker: it waits (bounded) for the worker, and a sync that
fails anyway leaves every worker, the weight board and the controller on one version.

These tests kill each worker up to twice, so they get their own controller with a larger restart
budget than the shared one (`max_restarts=2`, which other modules' kills also draw on)."""

from __future__ import annotations

import time

import pytest
import ray
from ray.exceptions import RayActorError
from ray_helpers import GREEDY, generate_killing_a_worker, make_config, prompts_for, tiny_llama, versions_once_alive

from specroll.integrations.ray_backend.controller import RolloutController
from specroll.integrations.ray_backend.sync.protocol import WeightSyncError


@pytest.fixture(scope="module")
def controller(ray_cluster, tiny_model_paths):
    ctl = RolloutController(make_config(tiny_model_paths, max_restarts=10))
    yield ctl
    ctl.shutdown()


def served_versions(controller) -> dict[str, object]:
    """The policy version each worker serves (once alive), the board holds and the controller expects."""
    return {
        "workers": [versions_once_alive(w)["policy"] for w in controller.workers],
        "board": ray.get(controller.board.latest.remote())["policy"].version,
        "controller": controller.policy_version,
    }


def one_version(version: int, num_workers: int = 2) -> dict[str, object]:
    return {"workers": [version] * num_workers, "board": version, "controller": version}


class KilledBefore:
    """A worker handle whose actor is killed (Ray restarts it) once, just before `method` is called on it."""

    def __init__(self, handle, method: str):
        self.handle = handle
        self.method = method
        self.killed = False

    def __getattr__(self, name: str):
        if name == self.method and not self.killed:
            self.killed = True
            ray.kill(self.handle, no_restart=False)
            while True:  # until the kill has landed
                try:
                    ray.get(self.handle.versions.remote())
                except RayActorError:
                    break
                time.sleep(0.01)
        return getattr(self.handle, name)


def test_sync_right_after_a_worker_restart_reaches_every_worker(controller):
    controller.sync_policy(tiny_llama(32, 2, seed=41).state_dict(), controller.policy_version + 1)
    generate_killing_a_worker(controller, controller.workers[0], prompts_for(6), n=3)
    version = controller.policy_version + 1
    controller.sync_policy(tiny_llama(32, 2, seed=42).state_dict(), version)  # the victim may still restart
    assert served_versions(controller) == one_version(version)
    assert {r.policy_version for r in controller.generate(prompts_for(4), GREEDY, n=2)} == {version}


def test_failed_sync_leaves_one_version_and_a_retry_succeeds(controller):
    old = controller.policy_version + 1
    controller.sync_policy(tiny_llama(32, 2, seed=43).state_dict(), old)
    victim = controller.workers[0]
    controller.workers[0] = KilledBefore(victim, "stage_weights")
    try:
        with pytest.raises(WeightSyncError):
            controller.sync_policy(tiny_llama(32, 2, seed=44).state_dict(), old + 1)
    finally:
        controller.workers[0] = victim
    timeout_s = controller.config.sync.timeout_s
    controller.config.sync.timeout_s = 0.2  # shorter than the victim's restart
    try:
        with pytest.raises(WeightSyncError, match=r"0\.2 ?s"):
            controller.sync_policy(tiny_llama(32, 2, seed=44).state_dict(), old + 1)
    finally:
        controller.config.sync.timeout_s = timeout_s
    assert served_versions(controller) == one_version(old)
    assert {r.policy_version for r in controller.generate(prompts_for(4), GREEDY, n=2)} == {old}
    controller.sync_policy(tiny_llama(32, 2, seed=44).state_dict(), old + 1)
    assert served_versions(controller) == one_version(old + 1)


def test_worker_lost_after_the_commit_point_ends_on_the_new_version(controller):
    version = controller.policy_version + 1
    victim = controller.workers[1]
    controller.workers[1] = KilledBefore(victim, "commit_weights")
    try:
        controller.sync_policy(tiny_llama(32, 2, seed=45).state_dict(), version)
    finally:
        controller.workers[1] = victim
    assert served_versions(controller) == one_version(version)


def test_sync_skips_a_worker_ray_gave_up_on(controller):  # last: it leaves the module's controller one worker short
    ray.kill(controller.workers[0], no_restart=True)
    version = controller.policy_version + 1
    with pytest.warns(UserWarning, match="rollout worker 0 is dead"):
        controller.sync_policy(tiny_llama(32, 2, seed=46).state_dict(), version)
    assert ray.get(controller.workers[1].versions.remote())["policy"] == version
    assert {r.policy_version for r in controller.generate(prompts_for(4), GREEDY, n=2)} == {version}
