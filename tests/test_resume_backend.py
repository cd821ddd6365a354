"""A rollout service's `state_dict()` loaded into a fresh one on the same models goes on as the first: it serves
the learner's published drafter at its version, and the next round publishes the same weights — here for an
EAGLE head's learner (the head family: its buffer holds the policy's hidden states) on the local backend, with
the invariant sampler so both services draw the same rollouts."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from test_head_online import ENGINE, LEARNER, PROMPTS, moved, params
from tiny_models import tiny_lm

from specroll.integrations.local_backend import LocalBackend
from specroll.rollout.drafters.heads import EagleHead

ENGINE_INVARIANT = dataclasses.replace(ENGINE, sampler="invariant")
LEARNER_SHORT = dataclasses.replace(LEARNER, max_steps=6, gate_z=0.0)


def service(target: torch.nn.Module, head_seed: int = 1) -> LocalBackend:
    return LocalBackend.from_models(copy.deepcopy(target), EagleHead.for_target(target.config, seed=head_seed),
                                    ENGINE_INVARIANT, LEARNER_SHORT)


def step(backend: LocalBackend, policy: torch.nn.Module, index: int):
    backend.generate(PROMPTS, params(index), n=4)
    backend.start_learner_round(None)
    done = backend.finish_learner_round()
    backend.sync_policy(moved(policy, index), version=index + 1)
    return done.report


def test_a_service_loaded_from_state_dict_goes_on_as_the_one_that_saved_it():
    target = tiny_lm("llama", "sdpa", layers=2, logit_scale=10.0)
    policy = copy.deepcopy(target)
    first = service(target)
    for index in range(2):
        step(first, policy, index)
    assert first.learner.version > 0  # something was published: the loaded service must serve it
    state = first.state_dict()
    assert state["total_rollouts"] == 2 * len(PROMPTS) * 4
    second = service(target, head_seed=7)  # another first head: every weight must come from the state
    second.load_state_dict(state)
    second.sync_policy(moved(policy, 1), version=2)
    assert second.engine.drafter_version == first.engine.drafter_version == first.learner.version
    reports = [step(each, policy, 2) for each in (first, second)]
    assert reports[0].version == reports[1].version and reports[0].num_steps == reports[1].num_steps == 6
    for name, tensor in first.learner.published_version().weights.items():
        assert torch.equal(tensor, second.learner.published_version().weights[name]), name
    assert first.metrics()["rollout/total_rollouts"] == second.metrics()["rollout/total_rollouts"]


def test_a_state_without_a_learner_is_refused_by_a_service_with_one():
    target = tiny_lm("llama", "sdpa", layers=2, logit_scale=10.0)
    with pytest.raises(ValueError, match="the state has no learner and this backend has"):
        service(target).load_state_dict({"learner": None, "total_rollouts": 0})
