"""A seeded Ray rollout does not depend on the worker count: each row's random numbers are keyed by its
prompt's index in the whole call (the controller passes it with every chunk), not by worker or slot.
Invariant sampling: identical tokens whatever the workers; rejection sampling at a fixed γ: the same.

One worker serving the whole call is an engine built from the same paths as a worker builds its own,
run in this process (a 1-worker controller would cost a worker start for the same tokens); two workers
split the call into chunks. Rejection sampling is the session controller's sampler: it serves that case
once given back the saved weights (other tests sync their own); the invariant case starts a controller."""

from __future__ import annotations

import dataclasses

import pytest
from ray_helpers import shared_config, tiny_llama
from transformers import AutoModelForCausalLM

from specroll.integrations.model_source import load_drafter, tokenizer_pair
from specroll.integrations.ray_backend.controller import RolloutController
from specroll.rollout import SamplingParams, SpecEngine
from specroll.rollout.drafters.version import DrafterVersion


def two_workers(request, config) -> RolloutController:
    if config == shared_config(request.getfixturevalue("tiny_model_paths")):
        shared = request.getfixturevalue("controller")
        shared.sync_policy(tiny_llama(32, 2, seed=0).state_dict(), shared.policy_version + 1)  # the saved pair
        shared.sync_drafter(DrafterVersion(shared.drafter_version + 1, tiny_llama(16, 1, seed=1).state_dict()))
        return shared
    controller = RolloutController(config)
    request.addfinalizer(controller.shutdown)
    return controller


@pytest.mark.parametrize("sampler", ["invariant", "rejection"])
def test_one_and_two_workers_give_the_same_rollouts(request, ray_cluster, tiny_model_paths, sampler):
    prompts = [[3 + i, 7, (5 * i) % 64, 11] for i in range(6)]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=1234)
    config = shared_config(tiny_model_paths)
    config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, sampler=sampler))
    target = AutoModelForCausalLM.from_pretrained(config.models.target, dtype=config.engine.dtype)
    one_worker = SpecEngine(target, load_drafter(config.models, config.engine, target), config.engine,
                            *tokenizer_pair(config.models))  # what `RolloutWorker.__init__` builds
    whole_call = [r.completion_ids for r in one_worker.generate(prompts, params, n=3)]
    chunked = [r.completion_ids for r in two_workers(request, config).generate(prompts, params, n=3)]
    assert chunked == whole_call
    assert len({tuple(c) for c in whole_call}) > 6  # sampled: siblings differ, so the check has teeth
