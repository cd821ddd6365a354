"""One Ray rollout service for every trainer rank (`shared_service`): the main rank creates named actors in
a run namespace, another rank attaches to the same ones, syncs happen once (main rank) and every other
rank checks the version it is served. Both "ranks" run in this process, on the session cluster (a
fake `RankGroup` hands the main rank's broadcast to the other one); the 2-process run is
`test_trl_multirank.py` (slow)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import ray
from ray_helpers import GREEDY, make_config, prompts_for

from specroll.integrations.ray_backend.controller import RolloutController
from specroll.integrations.ray_backend.shared_service import shared_controller
from specroll.integrations.ray_backend.sync.protocol import WeightSyncError


class FakeRanks:
    """Rank `rank` of two; the broadcast hands on what the main rank sent before (same process)."""

    sent: ClassVar[list] = []

    def __init__(self, rank: int):
        self.is_main = rank == 0

    def broadcast(self, value):
        if self.is_main:
            FakeRanks.sent.append(value)
            return value
        return FakeRanks.sent[-1]


@pytest.fixture(scope="module")
def service(ray_cluster, tiny_model_paths):
    config = make_config(tiny_model_paths, strategy=None, online_learning=True)
    main = shared_controller(config, FakeRanks(0))
    other = shared_controller(config, FakeRanks(1))
    yield main, other
    other.shutdown()
    main.shutdown()


def named_actors(namespace: str) -> list[str]:
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace)


def test_every_rank_attaches_to_one_set_of_actors(service):
    main, other = service
    assert main.serves_all_ranks() and other.serves_all_ranks()
    assert other.namespace == main.namespace
    assert named_actors(main.namespace) == ["draft-learner", "rollout-worker-0", "rollout-worker-1", "weight-board"]
    assert [w._actor_id for w in other.workers] == [w._actor_id for w in main.workers]
    assert other.learner._actor_id == main.learner._actor_id


def test_one_sync_serves_every_rank_and_each_gets_its_own_prompts(service):
    main, other = service
    version = main.policy_version + 1
    target = _target_weights(main)
    main.sync_policy(target, version)
    other.await_policy(version)
    before = ray.get(main.learner.counts.remote())["rollouts"]
    mine, theirs = prompts_for(3), prompts_for(5)[3:]
    out_main, out_other = main.generate(mine, GREEDY, n=2), other.generate(theirs, GREEDY, n=2)
    assert [r.prompt_ids for r in out_main] == [p for p in mine for _ in range(2)]
    assert [r.prompt_ids for r in out_other] == [p for p in theirs for _ in range(2)]
    assert {r.policy_version for r in out_main + out_other} == {version}
    main.start_learner_round(None)  # every rank's rollouts are in the one learner's buffer by now
    main.finish_learner_round()
    counts = ray.get(main.learner.counts.remote())
    assert counts["rollouts"] - before == 2 * (len(mine) + len(theirs))


def test_a_rank_that_missed_the_sync_raises(service):
    main, other = service
    version = main.policy_version + 1
    main.sync_policy(_target_weights(main), version)
    with pytest.raises(RuntimeError, match=rf"policy versions \[{version}\]; current is {version - 1}"):
        other.generate(prompts_for(2), GREEDY, n=1)  # did not await_policy: its rollouts look stale
    with pytest.raises(WeightSyncError, match=rf"serves policy versions \[{version}\], not {version + 1}"):
        other.await_policy(version + 1)  # the main rank's sync never reached the service


def test_only_the_creating_rank_syncs_and_learns(service):
    _, other = service
    with pytest.raises(RuntimeError, match="only the controller that created the shared service"):
        other.sync_policy({}, 99)
    with pytest.raises(RuntimeError, match="only the controller that created the shared service"):
        other.start_learner_round(None)


def test_an_attached_controller_lets_go_without_stopping_the_service(service):
    main, _ = service
    RolloutController.attach(main.config, main.namespace).shutdown()
    assert all(ray.get(w.versions.remote())["policy"] == main.policy_version for w in main.workers)
    with pytest.raises(RuntimeError, match="no actor 'rollout-worker-0' in Ray namespace 'specroll-none'"):
        RolloutController.attach(main.config, "specroll-none", timeout_s=1.0)


def _target_weights(controller: RolloutController) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(controller.config.models.target)
    return {name: p.detach() for name, p in model.named_parameters()}


def rank_trainer(model, step: int, is_main: bool):
    """What the hook reads of a trainer rank of a two-process launch (the barrier passes at once here)."""
    from collections import defaultdict
    from types import SimpleNamespace

    return SimpleNamespace(
        model=model, state=SimpleNamespace(global_step=step), _metrics=defaultdict(lambda: defaultdict(list)),
        accelerator=SimpleNamespace(unwrap_model=lambda m: m, is_main_process=is_main, num_processes=2,
                                    wait_for_everyone=lambda: None),
    )


def test_the_hook_syncs_once_from_the_main_rank_and_a_stale_rank_raises(service):
    from transformers import AutoModelForCausalLM

    from specroll.integrations.trl_hook import SpecrollRolloutFunc

    main, other = service
    policy = AutoModelForCausalLM.from_pretrained(main.config.models.target)
    step = main.policy_version + 1
    SpecrollRolloutFunc(other).sync_policy(rank_trainer(policy, step - 1, is_main=False))  # not this step's
    with pytest.raises(WeightSyncError, match=rf"serves policy versions \[{step - 1}\], not {step}"):
        SpecrollRolloutFunc(other).sync_policy(rank_trainer(policy, step, is_main=False))  # main has not synced
    SpecrollRolloutFunc(main).sync_policy(rank_trainer(policy, step, is_main=True))
    SpecrollRolloutFunc(other).sync_policy(rank_trainer(policy, step, is_main=False))
    assert other.policy_version == main.policy_version == step
    assert [ray.get(w.versions.remote())["policy"] for w in main.workers] == [step, step]
