"""An EAGLE head trained online through the public path: the backend hosts a `HeadLearner`, rounds publish
it to the engine, probes score it against its frozen shadow, and the learner follows the policy's
embedding and LM head through every policy sync — locally and on Ray.

GRPO-shaped: each step generates G = 4 samples of a few prompts, runs the learner round (with a probe of
fixed prompts) as the TRL hook does, through `LearnerSchedule`, then syncs a moved policy.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import ray
import torch
from tiny_models import make_prompts, tiny_lm
from transformers import AutoModelForCausalLM

from specroll.integrations.learner_schedule import LearnerSchedule, ProbeSet
from specroll.integrations.local_backend import LocalBackend
from specroll.integrations.model_source import ModelPaths
from specroll.integrations.ray_backend.controller import RolloutController
from specroll.integrations.ray_backend.settings import ActorResources, ControllerConfig, SyncConfig, TopologyConfig
from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.heads.learner import HeadLearner
from specroll.rollout import EngineConfig, SamplingParams
from specroll.rollout.drafters.heads import EagleHead

PROMPTS = make_prompts(12, 2, 6, seed=5)
PROBE_PROMPTS = make_prompts(6, 2, 6, seed=9)
ENGINE = EngineConfig(max_batch_size=16, max_seq_len=40, gamma=3, drafters=("eagle",), signal_top_k=64)
LEARNER = LearnerConfig(lr=3e-3, max_steps=120, holdout_fraction=0.25, warmup_steps=0)


def params(step: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=24, temperature=1.0, seed=100 + step)


def moved(policy: torch.nn.Module, step: int) -> dict[str, torch.Tensor]:
    """The policy's weights with its embedding and LM head nudged: what a GRPO update hands the backend."""
    gen = torch.Generator().manual_seed(step)
    named = {n: p.detach().clone() for n, p in policy.named_parameters()}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        named[name] = named[name] + 0.05 * named[name].std() * torch.randn(named[name].shape, generator=gen)
    return named


def grpo_steps(backend, policy: torch.nn.Module, steps: int) -> tuple[list, LearnerSchedule]:
    schedule = LearnerSchedule(ProbeSet(PROBE_PROMPTS, every=1, samples=2))
    reports = []
    for step in range(steps):
        backend.generate(PROMPTS, params(step), n=4)
        probe = schedule.probe_request(step, PROBE_PROMPTS, params(50 + step), last_step=steps - 1)
        schedule.round_started()
        backend.start_learner_round(None, probe)
        done = backend.finish_learner_round()
        schedule.round_collected(done)
        reports.append(done.report)
        backend.sync_policy(moved(policy, step), version=step + 1)
    return reports, schedule


def test_local_backend_trains_the_eagle_head_online_and_follows_the_policy():
    target = tiny_lm("llama", "sdpa", layers=2, logit_scale=10.0)
    policy = {n: p.detach().clone() for n, p in target.named_parameters()}
    head = EagleHead.for_target(target.config, seed=1)
    backend = LocalBackend.from_models(target, head, ENGINE, LEARNER)
    try:
        assert isinstance(backend.learner, HeadLearner)
        reports, schedule = grpo_steps(backend, backend.engine.target.model, steps=2)
        assert reports[-1].version >= 1 and backend.engine.drafter_version == reports[-1].version
        assert all(r.acceptance_after > r.acceptance_frozen_shadow for r in reports)
        assert len(schedule.probes) == 2
        last = schedule.probes[-1]
        assert last["drafter/probe_online"] > last["drafter/probe_frozen"]  # the served head beats its shadow
        assert last["drafter/probe_drafter_version"] >= 1
        # The learner scores with the synced policy's embedding and LM head, not the step-0 ones.
        probe = backend.engine.generate(PROBE_PROMPTS, params(99), n=2)
        synced = backend.engine.target.model
        fresh = EagleHead.for_target(target.config, seed=1)  # `head` itself now serves in the engine
        reference = HeadLearner(fresh, synced.get_input_embeddings(), synced.get_output_embeddings(), LEARNER)
        assert backend.learner.probe(probe).frozen == pytest.approx(reference.probe(probe).frozen, abs=1e-9)
    finally:
        backend.shutdown()
        with torch.no_grad():  # the session-cached target: back to its own weights
            for name, param in target.named_parameters():
                param.copy_(policy[name])


def test_ray_learner_actor_trains_the_eagle_head_and_gets_the_policy(ray_cluster, tiny_model_paths):
    """Over a draft vocabulary: each published version brings its subset to the workers through the weight sync."""
    config = ControllerConfig(
        models=ModelPaths(tiny_model_paths["target"]),
        engine=dataclasses.replace(ENGINE, draft_vocab=24),
        topology=TopologyConfig(num_workers=1, worker=ActorResources(num_cpus=1), learner=ActorResources(num_cpus=1)),
        sync=SyncConfig(timeout_s=30.0),
        learner=dataclasses.replace(LEARNER, max_steps=20),  # what the actor does, not how far it learns
    )
    controller = RolloutController(config)
    try:
        assert sorted(ray.get(controller.learner.policy_names.remote())) == ["lm_head.weight",
                                                                             "model.embed_tokens.weight"]
        policy = AutoModelForCausalLM.from_pretrained(tiny_model_paths["target"])
        reports, schedule = grpo_steps(controller, policy, steps=2)
        assert all(r.gated and not math.isnan(r.acceptance_frozen_shadow) for r in reports)
        assert len(schedule.probes) == 2 and not math.isnan(schedule.probes[-1]["drafter/probe_gain"])
        versions = ray.get(controller.workers[0].versions.remote())
        assert versions == {"policy": 2, "drafter": reports[-1].version}
        served = ray.get(controller.workers[0].draft_vocab.remote())
        assert len(served) == 24 and served == ray.get(controller.learner.draft_vocab.remote())
    finally:
        controller.shutdown()
