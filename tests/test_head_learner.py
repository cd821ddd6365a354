"""The head learner: hidden states recorded with the rollouts train EAGLE and Medusa heads that draft better.

A tiny target samples completions with an "eagle"/"medusa" drafter and `record_signals=True` (so its
hidden states come with the rollouts, no second target forward); the learner trains a fresh head
on them and publishes it only past the gate. Then an engine with the published head must accept more
than with the fresh one — measured in the engine, not only in the learner's own score.
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import make_prompts, tiny_lm

from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.head_data import collate, from_rollout, from_target
from specroll.online_drafter.head_learner import HeadLearner
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.heads import EagleHead, MedusaHeads

PROMPTS = make_prompts(24, 2, 6, seed=5)
PARAMS = SamplingParams(max_new_tokens=24, temperature=1.0, seed=3)


def target():
    return tiny_lm("llama", "sdpa", layers=2, logit_scale=10.0)


def rollouts(model, head, n=4):
    # The whole vocabulary recorded: the learner's expected acceptance is then exact, not a top-k bound.
    config = EngineConfig(max_batch_size=16, max_seq_len=40, gamma=3, record_signals=True, signal_top_k=64)
    engine = SpecEngine(model, head, config)
    return engine, engine.generate(PROMPTS, PARAMS, n=n)


def test_recorded_features_are_one_target_forwards():
    model = target()
    _, out = rollouts(model, MedusaHeads(32, 2), n=1)
    recorded = from_rollout(out[0])
    offline = from_target(model, recorded.token_ids.tolist(), recorded.prompt_len)
    torch.testing.assert_close(recorded.hidden.float(), offline.hidden.float(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(recorded.topk_probs[:, :4], offline.topk_probs[:, :4], atol=1e-4, rtol=1e-3)
    assert collate([recorded]).weights.sum() == recorded.num_positions


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_trained_head_accepts_more_in_the_engine(kind):
    model = target()
    fresh = EagleHead.for_target(model.config, seed=1) if kind == "eagle" else MedusaHeads(32, 3)
    engine, out = rollouts(model, fresh)
    before = engine.stats.acceptance_rate
    learner = HeadLearner(fresh, model.get_input_embeddings(), model.get_output_embeddings(),
                          LearnerConfig(lr=3e-3, max_steps=300, holdout_fraction=0.25))
    learner.add_rollouts(out)
    report = learner.train_round()
    assert report.published and report.version == 1
    assert report.acceptance_after > report.acceptance_frozen_shadow + 0.05  # held-out, averaged over depths
    assert not any(p.grad is not None for p in model.parameters())  # the policy is never trained
    engine.update_drafter(learner.published_state_dict(), learner.version)
    before_update = engine.stats.totals()
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=24, temperature=1.0, seed=4), n=4)
    assert engine.stats.since(before_update).acceptance_rate - before > 0.05


def test_feature_sequences_are_buffered_as_their_rollouts_are():
    model = target()
    head = EagleHead.for_target(model.config, seed=1)
    _, out = rollouts(model, head, n=2)
    from_rollouts, from_features = (HeadLearner(head, model.get_input_embeddings(), model.get_output_embeddings())
                                    for _ in range(2))
    from_rollouts.add_rollouts(out)
    from_features.add(from_rollout(r) for r in out if r.completion_ids)  # offline: cached samples
    assert len(from_features.holdout) == len(from_rollouts.holdout) > 0
    assert len(from_features.buffer) == len(from_rollouts.buffer) > 0
    assert from_features.holdout.keys == from_rollouts.holdout.keys


def test_a_first_version_is_trained_once_in_two_phases_and_cached(tmp_path):
    """`load_or_train_heads` (what `specroll train` calls for a demo head): only the heads asked for, at the
    settings' width, trained at `lr` then `final_lr`, cached, and loaded — not retrained — the next time."""
    from specroll.benchmarks.head_training import HeadTrainingSettings, heads_dir, load_or_train_heads

    model = target()
    settings = HeadTrainingSettings(prompts=8, samples=2, max_new_tokens=12, eagle_intermediate_size=24,
                                    eagle_budget_s=1.5, round_s=0.5)
    models_dir = tmp_path / "demo-test"
    heads = load_or_train_heads(model, PROMPTS[:8], (0,), models_dir, settings, names=("eagle",))
    assert list(heads) == ["eagle"] and heads["eagle"].gate_proj.weight.shape[0] == 24
    folder = heads_dir(models_dir)
    assert sorted(p.name for p in folder.iterdir()) == ["eagle.pt", "report.json", "samples.pt"]
    report = json.loads((folder / "report.json").read_text())
    assert [r["lr"] for r in report["eagle"]] == [settings.lr] * 2 + [settings.final_lr]
    saved = (folder / "eagle.pt").stat().st_mtime_ns
    again = load_or_train_heads(model, PROMPTS[:8], (0,), models_dir, settings, names=("eagle",))
    assert (folder / "eagle.pt").stat().st_mtime_ns == saved
    torch.testing.assert_close(again["eagle"].state_dict(), heads["eagle"].state_dict())
    with pytest.raises(ValueError, match="unknown"):
        load_or_train_heads(model, PROMPTS[:8], (0,), models_dir, settings, names=("medusa2",))
