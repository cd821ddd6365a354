"""The recurrent (ReDrafter) head trained online through the public path, as the EAGLE-3 head is
(tests/test_eagle3_online.py).

`LocalBackend.from_models` hosts the one learner (`HeadLearner` on `RecurrentObjective`) for a fresh recurrent head
through the target's LM head, and for one with its own LM head over a draft vocabulary; two GRPO-shaped steps (G = 4
samples of 12 prompts, a learner round with a probe, a moved policy synced after each) publish versions that reach
the engine and score above the frozen shadow on the probe. And `specroll train` runs the whole job on
configs/demo_recurrent_tiny.yaml: in process on the local backend (default suite), as shipped on Ray (slow).
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch
import yaml
from tiny_models import build_lm, make_prompts
from train_runs import REPO, run_train

from specroll.integrations.learner_schedule import LearnerSchedule, ProbeSet
from specroll.integrations.local_backend import LocalBackend
from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.heads.learner import HeadLearner
from specroll.rollout import EngineConfig, SamplingParams
from specroll.rollout.drafters.heads import RecurrentHead

PROMPTS = make_prompts(12, 2, 6, seed=5)
PROBE_PROMPTS = make_prompts(6, 2, 6, seed=9)
ENGINE = EngineConfig(max_batch_size=16, max_seq_len=40, gamma=3, drafters=("recurrent",), signal_top_k=64)
LEARNER = LearnerConfig(lr=3e-3, max_steps=120, holdout_fraction=0.25, warmup_steps=0)
TINY = REPO / "configs" / "demo_recurrent_tiny.yaml"


def params(step: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=24, temperature=1.0, seed=100 + step)


def moved(policy: torch.nn.Module, step: int) -> dict[str, torch.Tensor]:
    """The policy's weights with its embedding and LM head nudged: what a GRPO update hands the backend."""
    gen = torch.Generator().manual_seed(step)
    named = {n: p.detach().clone() for n, p in policy.named_parameters()}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        named[name] = named[name] + 0.05 * named[name].std() * torch.randn(named[name].shape, generator=gen)
    return named


@pytest.mark.parametrize("own_head", [False, True], ids=["target_head", "own_head"])
def test_local_backend_trains_the_recurrent_head_online(own_head):
    target = build_lm("llama", "sdpa", layers=2, logit_scale=10.0)  # not the cached one: the syncs move it
    ids = torch.arange(0, 64, 2) if own_head else None
    head = RecurrentHead.for_target(target.config, depths=2, draft_ids=ids, seed=1)
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
        assert not torch.equal(served["rnn_u.weight"], initial["rnn_u.weight"])  # the recurrence trained
        if own_head:  # its own LM head trained too, over the same ids
            assert torch.equal(backend.engine.drafter.head.draft_ids, ids)
            assert not torch.equal(served["lm_head.weight"], initial["lm_head.weight"])
    finally:
        backend.shutdown()


def test_specroll_train_runs_the_tiny_recurrent_job_in_process(tiny_demo_cache, tmp_path, monkeypatch):
    """configs/demo_recurrent_tiny.yaml on the local backend: a fresh head drafts from the first step, the learner
    trains it, the probe scores it and its frozen shadow."""
    pytest.importorskip("trl")
    from specroll.jobs import train

    config = yaml.safe_load(TINY.read_text())
    config["backend"] = {"kind": "local"}
    config["report"]["out_dir"] = str(tmp_path / "report")
    path = tmp_path / "recurrent.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("SPECROLL_CACHE", str(tiny_demo_cache))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "report" / "tensorboard"))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    assert train.run(argparse.Namespace(config=str(path), out_dir=None)) == 0
    steps = [json.loads(line) for line in (tmp_path / "report" / "metrics.jsonl").read_text().splitlines()]
    drafted = [e for e in steps if "rollout/recurrent/acceptance_rate" in e]
    assert len(drafted) == 2 and all(e["rollout/recurrent/proposals"] > 0 for e in drafted)
    assert any("drafter/probe_online" in e and "drafter/probe_frozen" in e for e in steps)


@pytest.mark.slow
def test_the_shipped_tiny_recurrent_job_runs_on_ray(tiny_demo_cache, tmp_path_factory):
    pytest.importorskip("trl")
    pytest.importorskip("ray")
    run = run_train(TINY, tmp_path_factory.mktemp("report"), tiny_demo_cache, tmp_path_factory.mktemp("logs"))
    assert run.returncode == 0, run.stderr[-4000:]
    steps = [json.loads(line) for line in (run.out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in steps if "reward" in e] == [1, 2]
    assert all(e["rollout/recurrent/proposals"] > 0 for e in steps if "reward" in e)
