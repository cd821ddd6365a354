"""vLLM on Ray rollout workers (`engine.kind: vllm`, `backend.kind: ray`): one in-process `vllm.LLM` per
`RolloutWorker`, through the public `RolloutController`, on the session Ray cluster, with an online learner.

- Greedy: the worker's speculative output is the target's greedy decoding token for token (Hugging Face's, fp32).
- Refit: after a publish (the learner's rounds) and a policy sync, every worker's vLLM proposer serves the published
  digest (asked of vLLM's worker through specroll's extension, not of specroll's bookkeeping).
- An injected loss — the drafter's weights dropped inside vLLM's proposer, as a wake without them leaves it — is
  caught at the next batch's start and repaired before it runs (an event, `digest_mismatches`), and the batch's
  drafts are kept as before.
- A worker Ray restarts (killed) comes back serving the current policy and the published drafter (from the weight
  board), checked the same way, and decodes the target's greedy tokens.
Slow: a vLLM start in a Ray actor (~30 s) plus learner rounds.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("vllm")

import ray
from ray.exceptions import ActorUnavailableError, RayActorError
from tiny_models import VLLM_SHAPE, build_lm, hf_greedy, make_prompts

from specroll.integrations.model_source import ModelPaths
from specroll.integrations.ray_backend.controller import RolloutController
from specroll.integrations.ray_backend.settings import ActorResources, ControllerConfig, SyncConfig, TopologyConfig
from specroll.integrations.vllm.settings import VllmSettings
from specroll.online_drafter import LearnerConfig
from specroll.rollout import EngineConfig, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(ray_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_ray")
    target = build_lm("llama", **VLLM_SHAPE, layers=2, seed=21)
    drafter = build_lm("llama", **VLLM_SHAPE, layers=1, seed=21)
    target.save_pretrained(root / "target")
    drafter.save_pretrained(root / "drafter")
    config = ControllerConfig(
        models=ModelPaths(str(root / "target"), str(root / "drafter")),
        engine=EngineConfig(kind="vllm", gamma=3, drafters=("model",), max_batch_size=16, max_seq_len=64),
        topology=TopologyConfig(num_workers=1, worker=ActorResources(num_cpus=1), learner=ActorResources(num_cpus=1),
                                placement_strategy=None, max_restarts=1),
        sync=SyncConfig(timeout_s=120.0),
        learner=LearnerConfig(lr=1e-3, max_steps=4, batch_size=4, holdout_fraction=0.5, warmup_steps=0, gate_z=0.0),
        vllm=VllmSettings(kv_cache_gib=1))
    controller = RolloutController(config, placement_timeout_s=300.0)
    yield target, controller
    controller.shutdown()


def served(controller) -> list[str | None]:
    return ray.get([w.drafter_digest.remote() for w in controller.workers])


def test_vllm_workers_decode_the_targets_greedy_tokens(world):
    target, controller = world
    prompts = make_prompts(6, 2, 7, vocab=VLLM_SHAPE["vocab"], seed=5)
    out = controller.generate(prompts, SamplingParams(max_new_tokens=10, temperature=0.0), n=2)
    assert [r.completion_ids for r in out] == [hf_greedy(target, p, 10) for p in prompts for _ in range(2)]
    assert sum(r.num_drafted for r in out) > 0


def test_published_versions_are_what_every_vllm_worker_serves_and_a_loss_is_repaired_before_the_batch(world):
    target, controller = world
    prompts = make_prompts(16, 3, 6, vocab=VLLM_SHAPE["vocab"], seed=7)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=1)
    for _ in range(6):  # rounds until the learner publishes (gate_z 0: a candidate that gained anything)
        controller.generate(prompts, params, n=2)
        controller.start_learner_round(None)
        controller.finish_learner_round()
        if controller.drafter_version > 0:
            break
    assert controller.drafter_version > 0, "the learner published no version in 6 rounds"
    assert served(controller) == [controller.guard.digest]
    controller.sync_policy({k: v + 0.0 for k, v in target.state_dict().items()}, version=1)
    assert served(controller) == [controller.guard.digest]

    def drop_embedding(worker):  # what a wake that lost the drafter's weights leaves, inside vLLM's proposer
        worker.engine.llm.collective_rpc(
            lambda w: w.model_runner.drafter.model.model.embed_tokens.weight.data.zero_())

    ray.get(controller.workers[0].__ray_call__.remote(drop_embedding))
    assert served(controller) == [None]
    mismatches = controller.watch.digest_mismatches
    out = controller.generate(prompts, params, n=2)
    assert controller.watch.digest_mismatches == mismatches + 1
    assert any("batch start" in event for event in controller.watch.events)
    assert served(controller) == [controller.guard.digest]
    assert sum(r.num_accepted for r in out) > 0


def test_a_restarted_vllm_worker_serves_the_published_drafter_and_current_policy(world):
    target, controller = world
    victim = controller.workers[0]
    pid = ray.get(victim.__ray_call__.remote(lambda _: __import__("os").getpid()))
    ray.kill(victim, no_restart=False)
    deadline = time.monotonic() + 180
    while True:  # until Ray restarted it (a vLLM start in the new process): another process answers
        try:
            if ray.get(victim.__ray_call__.remote(lambda _: __import__("os").getpid()), timeout=180) != pid:
                break
        except (ActorUnavailableError, RayActorError):
            assert time.monotonic() < deadline, "the killed worker was not restarted within 180 s"
        time.sleep(0.5)
    assert ray.get(victim.versions.remote()) == {"policy": controller.policy_version,
                                                 "drafter": controller.drafter_version}
    assert served(controller) == [controller.guard.digest]
    prompts = make_prompts(4, 2, 7, vocab=VLLM_SHAPE["vocab"], seed=3)
    out = controller.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
    assert [r.completion_ids for r in out] == [hf_greedy(target, p, 8) for p in prompts]
