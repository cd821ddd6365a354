"""RolloutController over RolloutWorker actors: grouping and order, a worker killed mid-batch,
multi-node placement, a failed rollout. Shares the session cluster and one controller (actor start-up costs seconds)."""

from __future__ import annotations

import pytest
import ray
import torch
from ray_helpers import GREEDY, generate_killing_a_worker, prompts_for, tiny_llama, versions_once_alive

from specroll.integrations.backend import RolloutError
from specroll.integrations.ray_backend.dispatch import split_groups
from specroll.rollout import EngineConfig


def test_split_groups_is_contiguous_and_balanced():
    assert split_groups(5, 2) == [range(0, 3), range(3, 5)]
    assert split_groups(1, 4) == [range(0, 1)]


def test_generate_keeps_input_order_and_groups(controller):
    prompts = prompts_for(5)
    rollouts = controller.generate(prompts, GREEDY, n=3)
    assert [r.prompt_ids for r in rollouts] == [p for p in prompts for _ in range(3)]
    assert all(len(r.completion_ids) == 6 for r in rollouts)


def test_ray_path_matches_the_engine_run_directly(controller, tiny_model_paths):
    from transformers import AutoModelForCausalLM

    from specroll.rollout import SpecEngine

    target = tiny_llama(32, 2, seed=21)
    controller.sync_policy(target.state_dict(), version=controller.policy_version + 1)
    engine = SpecEngine(target, AutoModelForCausalLM.from_pretrained(tiny_model_paths["drafter"]),
                        EngineConfig(max_batch_size=8, max_seq_len=128, gamma=2))
    prompts = prompts_for(4)
    direct = engine.generate(prompts, GREEDY, n=2)
    via_ray = controller.generate(prompts, GREEDY, n=2)
    assert [r.completion_ids for r in via_ray] == [r.completion_ids for r in direct]


def test_worker_killed_mid_batch_loses_and_duplicates_nothing(controller):
    target = tiny_llama(32, 2, seed=5)
    controller.sync_policy(target.state_dict(), version=7)
    prompts = prompts_for(6)
    victim = controller.workers[0]
    rollouts = generate_killing_a_worker(controller, victim, prompts, n=3)
    assert controller.num_resends >= 1
    assert [r.prompt_ids for r in rollouts] == [p for p in prompts for _ in range(3)]
    assert {r.policy_version for r in rollouts} == {7}
    assert versions_once_alive(victim)["policy"] == 7  # the restarted worker reloaded the current policy


def test_strict_spread_places_workers_on_two_nodes(controller):
    assert controller.config.topology.placement_strategy == "STRICT_SPREAD"
    nodes = {ray.get(w.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()))
             for w in controller.workers}
    assert len(nodes) == 2
    rollouts = controller.generate(prompts_for(4), GREEDY, n=2)
    assert len(rollouts) == 8


def test_the_weight_board_never_imports_torch(controller):
    """The board only holds payloads: its process must stay light (it starts with every controller)."""
    assert not ray.get(controller.board.__ray_call__.remote(lambda _: "torch" in __import__("sys").modules))


def test_policy_sync_changes_what_workers_generate(controller):
    prompts = prompts_for(2)
    controller.sync_policy(tiny_llama(32, 2, seed=11).state_dict(), version=8)
    first = controller.generate(prompts, GREEDY, n=1)
    controller.sync_policy(tiny_llama(32, 2, seed=12).state_dict(), version=9)
    second = controller.generate(prompts, GREEDY, n=1)
    assert {r.policy_version for r in second} == {9}
    assert [r.completion_ids for r in first] != [r.completion_ids for r in second]
    assert torch.is_tensor(next(iter(tiny_llama(32, 2, seed=12).state_dict().values())))


def test_a_failed_rollout_raises_naming_its_prompt_with_every_rollout(controller):
    bad_token = 13
    target = tiny_llama(32, 2, seed=13)
    with torch.no_grad():  # any prompt holding `bad_token` gets non-finite logits: its rollouts end in "error"
        target.model.embed_tokens.weight[bad_token] = float("nan")
    controller.sync_policy(target.state_dict(), controller.policy_version + 1)
    prompts = [[5, 6, 7], [8, bad_token, 9], [10, 11]]
    try:
        with pytest.raises(RolloutError, match=r"rollouts 2, 3\) .*prompt 1 \[8, 13, 9\]") as raised:
            controller.generate(prompts, GREEDY, n=2)
    finally:
        controller.sync_policy(tiny_llama(32, 2, seed=14).state_dict(), controller.policy_version + 1)
    rollouts = raised.value.rollouts
    assert [r.prompt_ids for r in rollouts] == [p for p in prompts for _ in range(2)]
    assert [r.finish_reason for r in rollouts] == ["length"] * 2 + ["error"] * 2 + ["length"] * 2
