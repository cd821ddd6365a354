"""A block drafter trained online through the public path, as the EAGLE-3 head is (tests/test_eagle3_online.py).

`LocalBackend.from_models` hosts the one learner (`BlockLearner`: blocks anchored over the rollouts' positions)
for a fresh block head; two GRPO-shaped steps (G = 4 samples of 12 prompts, a learner round with a probe, a
moved policy synced after each) publish versions that reach the engine and score above the frozen shadow on the
held-out positions and the probe. And `specroll train` on the tiny demo with `engine.drafters: [dflash]` and a
fresh head drafts with it every step.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_eagle3_online import PROBE_PROMPTS, PROMPTS, moved, params
from tiny_models import build_lm

from specroll.integrations.learner_schedule import LearnerSchedule, ProbeSet
from specroll.integrations.local_backend import LocalBackend
from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.heads.block_learner import BlockLearner
from specroll.rollout import EngineConfig
from specroll.rollout.drafters.heads.block import BlockHead

ENGINE = EngineConfig(max_batch_size=16, max_seq_len=40, gamma=3, drafters=("block",), block_size=4, signal_top_k=64)
LEARNER = LearnerConfig(lr=3e-3, max_steps=120, holdout_fraction=0.25, warmup_steps=0)


def test_local_backend_trains_the_block_head_online():
    target = build_lm("llama", "sdpa", layers=4, logit_scale=10.0)  # not the cached one: the syncs move it
    head = BlockHead.for_target(target.config, block_size=4, seed=1)
    initial = {n: t.detach().clone() for n, t in head.state_dict().items()}
    backend = LocalBackend.from_models(target, head, ENGINE, LEARNER)
    try:
        assert isinstance(backend.learner, BlockLearner)
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
        assert not torch.equal(served["fc.weight"], initial["fc.weight"])
    finally:
        backend.shutdown()


TRAIN = """
models: {{source: demo, recipe: tiny}}
grpo: {{steps: 2, prompts_per_step: 2, num_generations: 2, max_completion_length: 16, learning_rate: 1.0e-3,
        num_train_prompts: 8}}
backend: {{kind: local}}
engine: {{max_batch_size: 4, max_seq_len: 96, gamma: 3, drafters: [dflash], block_size: 4, cost_model_budget_s: 0.3}}
learner: {{max_steps: 4, batch_size: 4, warmup_steps: 0}}
probe: {{prompts: 0}}
report: {{out_dir: {root}/report, speed_prompts: 2, speed_repeats: 1}}
torch_threads: 1
"""


def test_specroll_train_drafts_and_trains_a_fresh_block_head(tiny_demo_cache, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    import argparse
    import json

    from specroll.jobs import train

    monkeypatch.setenv("SPECROLL_CACHE", str(tiny_demo_cache))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "report" / "tensorboard"))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    config = tmp_path / "block.yaml"
    config.write_text(TRAIN.format(root=tmp_path))
    assert train.run(argparse.Namespace(config=str(config), out_dir=None)) == 0
    steps = [json.loads(line) for line in (tmp_path / "report" / "metrics.jsonl").read_text().splitlines()]
    drafted = [e for e in steps if "rollout/block/acceptance_rate" in e]
    assert len(drafted) == 2 and all(e["rollout/block/proposals"] > 0 for e in drafted)
