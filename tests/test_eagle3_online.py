"""An EAGLE-3 head trained online through the public path, as the EAGLE head is (tests/test_head_online.py).

`LocalBackend.from_models` hosts the one learner (`HeadLearner` on `Eagle3Objective`: the training-time test)
for a fresh EAGLE-3 head through the target's LM head, and for one with its own LM head over a draft vocabulary
(`d2t`); two GRPO-shaped steps (G = 4 samples of 12 prompts, a learner round with a probe, a moved policy
synced after each) publish versions that reach the engine and score above the frozen shadow on the probe.
The head on the target's LM head runs under the slow marker (trained online, it is also tests/test_eagle3.py's).
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
from specroll.rollout.drafters.eagle3_head import Eagle3Head

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
            assert torch.equal(served["draft_ids"], ids)
            assert not torch.equal(served["lm_head.weight"], initial["lm_head.weight"])
    finally:
        backend.shutdown()
