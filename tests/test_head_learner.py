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
from specroll.online_drafter.heads.data import collate, from_rollout, from_target
from specroll.online_drafter.heads.learner import HeadLearner
from specroll.online_drafter.heads.objectives import objective_for
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads

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


CHEAP = dict(compute_dtype="bfloat16", train_depths=1)  # configs/demo_eagle.yaml's learner


@pytest.mark.parametrize("kind,cheap", [("eagle", False), ("medusa", False), ("eagle", True)],
                         ids=["eagle", "medusa", "eagle-bf16-first-depth"])
def test_trained_head_accepts_more_in_the_engine(kind, cheap):
    model = target()
    fresh = EagleHead.for_target(model.config, seed=1) if kind == "eagle" else MedusaHeads(32, 3)
    engine, out = rollouts(model, fresh)
    before = engine.stats.acceptance_rate
    learner = HeadLearner(fresh, model.get_input_embeddings(), model.get_output_embeddings(),
                          LearnerConfig(lr=3e-3, max_steps=300, holdout_fraction=0.25, **(CHEAP if cheap else {})))
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
    from specroll.demo.heads import HeadTrainingSettings, heads_dir, load_or_train_heads

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


def test_the_first_depth_alone_is_the_full_objectives_first_depth():
    """`train_depths=1` drops the second draft's pass, not a term of the first: same log q and feature loss."""
    model = target()
    head = EagleHead.for_target(model.config, seed=1)
    _, out = rollouts(model, head, n=1)
    batch = collate([from_rollout(r) for r in out[:6] if r.completion_ids])
    objective = objective_for(head, model.get_input_embeddings(), model.get_output_embeddings())
    with torch.no_grad():
        full, first = objective(head, batch, 1.0), objective(head, batch, 1.0, depths=1)
    assert full.log_q.shape[1] == 2 and first.log_q.shape[1] == 1
    torch.testing.assert_close(first.log_q[:, 0], full.log_q[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first.aux_loss, full.aux_loss)
    assert not torch.allclose(full.log_q[:, 1], full.log_q[:, 0])  # the second depth is another draft


def test_bf16_trains_and_gates_under_autocast_but_probes_in_fp32():
    model = target()
    head = EagleHead.for_target(model.config, seed=1)
    _, out = rollouts(model, head, n=4)
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    cheap = HeadLearner(head, embed, lm_head, LearnerConfig(max_steps=2, holdout_fraction=0.25, **CHEAP))
    exact = HeadLearner(head, embed, lm_head, LearnerConfig(max_steps=2, holdout_fraction=0.25))
    dtypes = []
    hook = cheap.candidate.model.q_proj.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    for learner in (cheap, exact):
        learner.add_rollouts(out)
        report = learner.train_round()
        assert report.gated and report.num_steps == 2
    hook.remove()
    assert dtypes and set(dtypes) == {torch.bfloat16}  # the candidate's training forwards
    gate_frozen, exact_frozen = cheap._entry_scores["frozen"], exact._entry_scores["frozen"]
    assert not torch.equal(gate_frozen, exact_frozen)  # the gate scored under autocast ...
    torch.testing.assert_close(gate_frozen, exact_frozen, rtol=0.05, atol=0.1)  # ... close to fp32
    probe = out[-4:]
    assert cheap.probe(probe).frozen == exact.probe(probe).frozen  # the measure is fp32 either way


def test_bad_compute_settings_are_refused_early():
    model = target()
    head = EagleHead.for_target(model.config, seed=1)
    with pytest.raises(ValueError, match="compute_dtype='float16' is invalid: one of"):
        LearnerConfig(compute_dtype="float16")
    with pytest.raises(ValueError, match="train_depths=0 is invalid"):
        LearnerConfig(train_depths=0)
    with pytest.raises(ValueError, match=r"train_depths=3 is invalid for this head: .* \[1, 2\]"):
        HeadLearner(head, model.get_input_embeddings(), model.get_output_embeddings(), LearnerConfig(train_depths=3))
