"""An EAGLE-3 head trained online through the public path, as the EAGLE head is (tests/test_head_online.py).

`LocalBackend.from_models` hosts the one learner (`HeadLearner` on `Eagle3Objective`: the training-time test)
for a fresh EAGLE-3 head through the target's LM head, and for one with its own LM head over a draft vocabulary
(`d2t`); two GRPO-shaped steps (G = 4 samples of 12 prompts, a learner round with a probe, a moved policy
synced after each) publish versions that reach the engine and score above the frozen shadow on the probe.
The head on the target's LM head runs under the slow marker (trained online, it is also tests/test_eagle3.py's).
And `specroll train` on the tiny demo with `models.head` a speculators checkpoint folder serves and trains it.
"""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import build_lm, make_prompts

from specroll.integrations.learner_schedule import LearnerSchedule, ProbeSet
from specroll.integrations.local_backend import LocalBackend
from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.heads.learner import HeadLearner
from specroll.rollout import EngineConfig, SamplingParams
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head

PROMPTS = make_prompts(12, 2, 6, seed=5)
PROBE_PROMPTS = make_prompts(6, 2, 6, seed=9)
ENGINE = EngineConfig(max_batch_size=16, max_seq_len=40, gamma=3, drafters=("eagle3",), signal_top_k=64)
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


@pytest.mark.parametrize("own_head", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["target_head", "own_head"])
def test_local_backend_trains_the_eagle3_head_online(own_head):
    target = build_lm("llama", "sdpa", layers=4, logit_scale=10.0)  # not the cached one: the syncs move it
    ids = torch.arange(0, 64, 2) if own_head else None
    head = Eagle3Head.for_target(target.config, seed=1, draft_ids=ids, ttt_steps=2)
    if own_head:
        with torch.no_grad():
            head.lm_head.weight.copy_(target.lm_head.weight[ids])
    initial = {n: t.detach().clone() for n, t in head.state_dict().items()}
    backend = LocalBackend.from_models(target, head, ENGINE, LEARNER)
    try:
        assert isinstance(backend.learner, HeadLearner)
        schedule = LearnerSchedule(ProbeSet(PROBE_PROMPTS, every=1, samples=2))
        reports = []
        for step in range(2):
            backend.generate(PROMPTS, params(step), n=4)
            probe = schedule.probe_request(step, PROBE_PROMPTS, params(50 + step), last_step=1)
            schedule.round_started()
            backend.start_learner_round(None, probe)
            done = backend.finish_learner_round()
            schedule.round_collected(done)
            reports.append(done.report)
            backend.sync_policy(moved(backend.engine.target.model, step), version=step + 1)
        assert all(math.isfinite(r.acceptance_after) for r in reports)
        assert reports[-1].version >= 1 and backend.engine.drafter_version == reports[-1].version
        assert all(r.acceptance_after > r.acceptance_frozen_shadow for r in reports)
        last = schedule.probes[-1]
        assert last["drafter/probe_online"] > last["drafter/probe_frozen"]  # the served head beats its shadow
        served = backend.engine.drafter.head.state_dict()
        assert not torch.equal(served["fc.weight"], initial["fc.weight"])  # the fusion of the layers trained
        if own_head:  # its own LM head trained too, over the same ids
            assert torch.equal(backend.engine.drafter.head.draft_ids, ids) and backend.engine.draft_vocab() is None
            assert not torch.equal(served["lm_head.weight"], initial["lm_head.weight"])
    finally:
        backend.shutdown()


TRAIN = """
models: {{source: demo, recipe: tiny, head: {head}}}
grpo: {{steps: 2, prompts_per_step: 2, num_generations: 2, max_completion_length: 16, learning_rate: 1.0e-3,
        num_train_prompts: 8}}
backend: {{kind: local}}
engine: {{max_batch_size: 4, max_seq_len: 96, gamma: 3, drafters: [eagle3], cost_model_budget_s: 0.3}}
learner: {{max_steps: 4, batch_size: 4, warmup_steps: 0}}
probe: {{prompts: 0}}
report: {{out_dir: {root}/report, speed_prompts: 2, speed_repeats: 1}}
torch_threads: 1
"""


def test_specroll_train_serves_a_speculators_checkpoint(tiny_demo_cache, tmp_path, monkeypatch):
    """`models.head` a public checkpoint folder: the run loads it (checked against the demo target), drafts with it
    and trains it online."""
    pytest.importorskip("trl")
    import argparse
    import json

    from eagle3_layouts import write_speculators

    from specroll.demo.model_cache import load_or_build_demo_models
    from specroll.demo.recipe import DemoRecipe
    from specroll.jobs import train

    demo_target = load_or_build_demo_models(DemoRecipe.tiny(), cache_dir=tiny_demo_cache, progress=False).target
    vocab = demo_target.get_output_embeddings().weight.shape[0]
    ids = torch.arange(0, vocab, 2)
    head = Eagle3Head.for_target(demo_target.config, seed=4, draft_ids=ids)
    with torch.no_grad():
        head.lm_head.weight.copy_(demo_target.get_output_embeddings().weight[ids])
    folder = write_speculators(head, demo_target, tmp_path / "eagle3-ckpt")
    monkeypatch.setenv("SPECROLL_CACHE", str(tiny_demo_cache))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "report" / "tensorboard"))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    config = tmp_path / "eagle3.yaml"
    config.write_text(TRAIN.format(root=tmp_path, head=folder))
    assert train.run(argparse.Namespace(config=str(config), out_dir=None)) == 0
    steps = [json.loads(line) for line in (tmp_path / "report" / "metrics.jsonl").read_text().splitlines()]
    drafted = [e for e in steps if "rollout/eagle3/acceptance_rate" in e]
    assert len(drafted) == 2 and all(e["rollout/eagle3/proposals"] > 0 for e in drafted)  # the checkpoint drafted


@pytest.mark.slow
def test_ray_workers_serve_a_checkpoint_the_learner_actor_trains(ray_cluster, tiny_model_paths, tmp_path):
    """On Ray: the worker and the learner actor both load `models.head` (a SpecForge-layout folder); the actor
    trains it (finite losses, gated rounds), and the worker serves what the learner holds — the controller's
    digest guard compares the two after every sync and raises if they differ."""
    import ray
    from eagle3_layouts import write_specforge
    from transformers import AutoModelForCausalLM

    from specroll.integrations.model_source import ModelPaths
    from specroll.integrations.ray_backend.controller import RolloutController
    from specroll.integrations.ray_backend.settings import ActorResources, ControllerConfig, SyncConfig, TopologyConfig

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_paths["target"])
    vocab = policy.get_output_embeddings().weight.shape[0]
    ids = torch.arange(0, vocab, 2)
    head = Eagle3Head.for_target(policy.config, (1,), seed=2, draft_ids=ids)
    with torch.no_grad():
        head.lm_head.weight.copy_(policy.get_output_embeddings().weight[ids])
    folder = write_specforge(head, policy, tmp_path / "specforge-ckpt")
    config = ControllerConfig(
        models=ModelPaths(tiny_model_paths["target"], head=str(folder)), engine=ENGINE,
        topology=TopologyConfig(num_workers=1, worker=ActorResources(num_cpus=1), learner=ActorResources(num_cpus=1)),
        sync=SyncConfig(timeout_s=30.0), learner=LEARNER)
    controller = RolloutController(config)
    try:
        schedule = LearnerSchedule(ProbeSet(PROBE_PROMPTS, every=1, samples=2))
        reports = []
        for step in range(2):
            batch = controller.generate(PROMPTS, params(step), n=4)
            assert len(batch) == 48 and sum(r.num_drafted for r in batch) > 0  # the worker drafted with the head
            probe = schedule.probe_request(step, PROBE_PROMPTS, params(50 + step), last_step=1)
            schedule.round_started()
            controller.start_learner_round(None, probe)
            schedule.round_collected(done := controller.finish_learner_round())
            reports.append(done.report)
            controller.sync_policy(moved(policy, step), version=step + 1)
        assert all(r.gated and r.num_steps > 0 and math.isfinite(r.loss) for r in reports)
        versions = ray.get(controller.workers[0].versions.remote())
        assert versions == {"policy": 2, "drafter": reports[-1].version}
        assert ray.get(controller.workers[0].draft_vocab.remote()) is None  # no subset set: the head's own ids
    finally:
        controller.shutdown()
