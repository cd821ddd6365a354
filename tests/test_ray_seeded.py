"""A seeded Ray rollout does not depend on the worker count: each row's random numbers are keyed by its
prompt's index in the whole call (the controller passes it with every chunk), not by worker or slot.
Invariant sampling: identical tokens whatever the workers; rejection sampling at a fixed γ: the same."""

from __future__ import annotations

import dataclasses

import pytest
from ray_fixtures import make_config

from specroll.integrations.ray_backend.controller import RolloutController
from specroll.rollout import SamplingParams


@pytest.mark.parametrize("sampler", ["invariant", "rejection"])
def test_one_and_two_workers_give_the_same_rollouts(ray_cluster, tiny_model_paths, sampler):
    prompts = [[3 + i, 7, (5 * i) % 64, 11] for i in range(6)]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=1234)
    completions = {}
    for workers in (1, 2):
        config = make_config(tiny_model_paths, num_workers=workers)
        config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, sampler=sampler))
        controller = RolloutController(config)
        try:
            completions[workers] = [r.completion_ids for r in controller.generate(prompts, params, n=3)]
        finally:
            controller.shutdown()
    assert completions[1] == completions[2]
    assert len({tuple(c) for c in completions[1]}) > 6  # sampled: siblings differ, so the check has teeth
