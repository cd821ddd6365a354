"""A learner recorded through `learner.record_dir` replays exactly (`tools.learner_replay`), and a
replay under other settings runs on the same inputs."""

from __future__ import annotations

import copy

import pytest
import torch
from online_fixtures import tiny_llama

from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.online_learner import make_online_learner
from specroll.online_drafter.recording import RecordingLearner
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads import MedusaHeads
from specroll.tools.learner_replay import apply_overrides, parse_set, replay, summary_lines

V = 32


def run_recorded(folder, budget_s=None):
    """Two steps of a run's loop (generate, learn, publish), the learner made as a backend makes it (record_dir set)."""
    target, drafter = tiny_llama(32, 2, seed=0), tiny_llama(16, 1, seed=1)
    config = LearnerConfig(lr=1e-2, max_steps=6, batch_size=4, seed=3, record_dir=str(folder))
    learner = make_online_learner(copy.deepcopy(drafter), None, config)
    assert isinstance(learner, RecordingLearner)
    engine = SpecEngine(target, drafter, EngineConfig(max_batch_size=16, max_seq_len=32, gamma=2,
                                                      record_signals=True, signal_top_k=8))
    prompts = [[i % V, (3 * i) % V] for i in range(8)]
    probe_prompts = [[(7 * i + 3) % V, i % V] for i in range(4)]
    reports, probes = [], []
    for step in range(2):
        params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=10 + step)
        learner.add_rollouts(engine.generate(prompts, params, n=2))
        reports.append(learner.train_round(budget_s=budget_s, break_even=0.1))
        if reports[-1].published:
            engine.update_drafter(learner.published_state_dict(), learner.version)
        probes.append(learner.probe(engine.generate(probe_prompts, params, n=2)))
    return reports, probes


def test_a_replay_of_a_step_bounded_run_reproduces_it_exactly(tmp_path):
    reports, probes = run_recorded(tmp_path / "rec")
    again = replay(str(tmp_path / "rec"), seed=3)
    assert again.num_steps == sum(r.num_steps for r in reports) == 12
    assert [(p.served, p.frozen, p.drafter_version) for p in again.probes] == \
        [(p.served, p.frozen, p.drafter_version) for p in probes]
    assert again.num_published == sum(r.published for r in reports)


def test_a_replay_under_other_settings_runs_on_the_same_inputs(tmp_path):
    run_recorded(tmp_path / "rec", budget_s=0.05)
    base, other = replay(str(tmp_path / "rec"), seed=0), replay(str(tmp_path / "rec"), 0, parse_set(["lr=1e-9"]))
    assert [p.frozen for p in base.probes] == [p.frozen for p in other.probes]  # the same rollouts
    assert other.num_published == 0 and base.num_steps > 0  # the virtual clock let the budget train
    lines = summary_lines([base, other])
    assert lines[-1].startswith("final probe, served − frozen: mean") and "over 2 seeds" in lines[-1]


def test_bad_recordings_and_settings_fail_early(tmp_path):
    with pytest.raises(ValueError, match="no learner recording"):
        replay(str(tmp_path))
    run_recorded(tmp_path / "rec")
    with pytest.raises(ValueError, match="not empty"):
        run_recorded(tmp_path / "rec")
    with pytest.raises(ValueError, match=r"not a learner setting; allowed: .*buffer\.recency_decay"):
        replay(str(tmp_path / "rec"), 0, {"learning_rate": 1e-3})
    with pytest.raises(ValueError, match="key=value"):
        parse_set(["lr"])
    with pytest.raises(ValueError, match="the drafter LM's costs are measured in float32 only"):
        replay(str(tmp_path / "rec"), 0, {"compute_dtype": "bfloat16"})
    # a setting newer than a recording (its recorded config lacks it) can still be replayed
    assert apply_overrides({"lr": 1e-4, "buffer": {}}, {"train_depths": 1}).train_depths == 1
    with pytest.raises(ValueError, match="pass the policy, got None"):
        make_online_learner(MedusaHeads(32, 2), None, LearnerConfig(record_dir=str(tmp_path / "head")))


def test_a_head_learner_recorded_through_a_backend_replays_exactly_across_policy_syncs(tmp_path):
    """The head reads the policy's embedding and LM head: a recording keeps every version a sync gave it,
    so the replay scores the frozen head as the run did after the sync (it would not on the first weights)."""
    from test_head_online import ENGINE, grpo_steps
    from tiny_models import tiny_lm

    from specroll.integrations.local_backend import LocalBackend
    from specroll.rollout.drafters.heads import EagleHead

    target = tiny_lm("llama", "sdpa", layers=2, logit_scale=10.0)
    policy = {n: p.detach().clone() for n, p in target.named_parameters()}
    config = LearnerConfig(lr=3e-3, max_steps=8, holdout_fraction=0.25, warmup_steps=0, seed=3,
                           record_dir=str(tmp_path / "rec"))
    backend = LocalBackend.from_models(target, EagleHead.for_target(target.config, seed=1), ENGINE, config)
    try:
        assert isinstance(backend.learner, RecordingLearner)
        reports, schedule = grpo_steps(backend, backend.engine.target.model, steps=3)
    finally:
        backend.shutdown()
        with torch.no_grad():  # the session-cached target: back to its own weights
            for name, param in target.named_parameters():
                param.copy_(policy[name])
    assert len(list((tmp_path / "rec").glob("*_policy.pt"))) == 2  # the syncs after steps 0 and 1
    again = replay(str(tmp_path / "rec"), seed=3)
    assert again.num_steps == sum(r.num_steps for r in reports) == 24
    assert [(p.served, p.frozen, p.drafter_version) for p in again.probes] == \
        [(p["drafter/probe_online"], p["drafter/probe_frozen"], p["drafter/probe_drafter_version"])
         for p in schedule.probes]


def test_a_block_head_learner_recorded_through_a_backend_replays_exactly(tmp_path):
    """A block head's recording replays with the block learner (its own scorer: anchors, one forward per block)."""
    import dataclasses

    from test_head_online import ENGINE, grpo_steps
    from tiny_models import build_lm

    from specroll.integrations.local_backend import LocalBackend
    from specroll.rollout.drafters.block_head import BlockHead

    target = build_lm("llama", "sdpa", layers=4, logit_scale=10.0)  # not the cached one: the syncs move it
    config = LearnerConfig(lr=3e-3, max_steps=6, holdout_fraction=0.25, warmup_steps=0, seed=3,
                           record_dir=str(tmp_path / "rec"))
    engine = dataclasses.replace(ENGINE, drafters=("block",), block_size=4)
    backend = LocalBackend.from_models(target, BlockHead.for_target(target.config, block_size=4, seed=1), engine,
                                       config)
    try:
        reports, schedule = grpo_steps(backend, backend.engine.target.model, steps=2)
    finally:
        backend.shutdown()
    again = replay(str(tmp_path / "rec"), seed=3)
    assert again.num_steps == sum(r.num_steps for r in reports) > 0
    assert [(p.served, p.frozen, p.drafter_version) for p in again.probes] == \
        [(p["drafter/probe_online"], p["drafter/probe_frozen"], p["drafter/probe_drafter_version"])
         for p in schedule.probes]
