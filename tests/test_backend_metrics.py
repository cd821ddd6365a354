"""One metrics path: the in-process and the Ray backend report the same `rollout/*` values for the same
rollouts, and each value is what its definition (docs/metrics.md) says."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from transformers import AutoModelForCausalLM

from specroll.integrations.backend import rollout_metrics
from specroll.integrations.local_backend import LocalBackend
from specroll.rollout import SamplingParams, SpecEngine
from specroll.rollout.drafters.version import DrafterVersion

# Seeded T = 1: a row's random numbers depend on (seed, prompt index, sample, position) only.
PARAMS = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
PROMPT = [[5, 9, 2, 41, 17, 3]]  # one prompt: one chunk, so one Ray worker, runs the whole group
TIMED = ("rollout/seconds", "rollout/tokens_per_s")


def test_local_and_ray_backends_report_identical_metrics(controller, tiny_model_paths):
    target = AutoModelForCausalLM.from_pretrained(tiny_model_paths["target"])
    drafter = AutoModelForCausalLM.from_pretrained(tiny_model_paths["drafter"])
    # The shared controller may serve other versions by now: give it the saved weights again.
    controller.sync_policy(target.state_dict(), controller.policy_version + 1)
    controller.sync_drafter(DrafterVersion(controller.drafter_version + 1, drafter.state_dict()))
    local = LocalBackend(SpecEngine(target, drafter, controller.config.engine))

    ray_rollouts = controller.generate(PROMPT, PARAMS, n=4)
    local_rollouts = local.generate(PROMPT, PARAMS, n=4)
    assert [r.completion_ids for r in ray_rollouts] == [r.completion_ids for r in local_rollouts]

    on_ray, in_process = rollout_metrics(controller.batch_stats()), rollout_metrics(local.batch_stats())
    assert set(on_ray) == set(in_process)
    assert {k: v for k, v in on_ray.items() if k not in TIMED} == {k: v for k, v in in_process.items()
                                                                   if k not in TIMED}
    tokens = sum(len(r.completion_ids) for r in local_rollouts)
    drafted = sum(r.num_drafted for r in local_rollouts)
    accepted = sum(r.num_accepted for r in local_rollouts)
    assert in_process["rollout/tokens"] == tokens > 0
    assert in_process["rollout/acceptance_rate"] == pytest.approx(accepted / drafted)
    assert 0 < in_process["rollout/gamma"] <= 2  # fixed γ = 2; steps near a row's budget draft less
    assert 1 <= in_process["rollout/mean_accepted_len"] <= 3  # 1 + accepted per speculative row-step
    assert 1 <= in_process["rollout/live_rows"] <= 4
    for metrics in (on_ray, in_process):
        assert metrics["rollout/tokens_per_s"] == pytest.approx(tokens / metrics["rollout/seconds"])


def test_both_backends_implement_the_whole_protocol():
    from specroll.integrations.backend import RolloutBackend
    from specroll.integrations.ray_backend.controller import RolloutController

    methods = [name for name in vars(RolloutBackend) if not name.startswith("_")]
    assert {"generate", "batch_stats", "published_drafter", "metrics", "shutdown"} <= set(methods)
    for backend in (LocalBackend, RolloutController):
        assert all(callable(getattr(backend, name, None)) for name in methods), backend
