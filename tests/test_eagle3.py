"""The EAGLE-3 drafter: exact, fed the target's own layers, and drafting what its training-time test trains.

Greedy: a fresh EAGLE-3 head (and one trained online, and one with its own LM head over a draft vocabulary)
gives plain decoding's tokens on Llama (sdpa, eager: HF's forward), Qwen2 and Qwen3 (lean forward), alone and
with the suffix drafter, at fixed and auto γ; the other verified architectures are the slow sweep. The plumbing:
the states verification captures are the target's residual stream entering the chosen layers (HF's
`output_hidden_states`, 1e-5 in fp32), and the head's cached drafts at depths 1..3 have exactly the q its
training-time test computes for them (`heads.objectives.Eagle3Objective`).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_prompts, tiny_lm

from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.heads.data import FeatureBatch
from specroll.online_drafter.heads.learner import HeadLearner
from specroll.online_drafter.heads.objectives import objective_for
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters import eagle
from specroll.rollout.drafters.draft_vocab import DraftVocab
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head, default_layers
from specroll.rollout.drafters.tree_draft import grow_tree
from specroll.rollout.models.architectures import VERIFIED_MODEL_TYPES
from specroll.tools.arch_sweep import prompts as sweep_prompts
from specroll.tools.arch_sweep import tiny_model

PROMPTS = make_prompts(12, 1, 9)  # one-token prompts included: a row with no captured state yet
GREEDY = SamplingParams(max_new_tokens=20, temperature=0)


def plain(target, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=0))
    return [r.completion_ids for r in engine.generate(prompts, params)]


def speculative(target, head=None, prompts=PROMPTS, **config) -> list[list[int]]:
    fields = dict(max_batch_size=5, max_seq_len=40, gamma=3, drafters=("eagle3",), cost_model_budget_s=0.3)
    engine = SpecEngine(target, head, EngineConfig(**{**fields, **config}))
    return [r.completion_ids for r in engine.generate(prompts, GREEDY)]


@pytest.mark.parametrize(("arch", "attn", "layers"), [("llama", "sdpa", 4), ("llama", "eager", 4),
                                                      ("qwen2", "sdpa", 6), ("qwen3", "sdpa", 5)])
@pytest.mark.parametrize("drafters", [("eagle3",), ("eagle3", "suffix")], ids="+".join)
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_greedy_equals_plain_decoding(arch, attn, layers, drafters, gamma):
    target = tiny_lm(arch, attn, layers=layers)
    assert speculative(target, drafters=drafters, gamma=gamma) == plain(target)


def test_captured_states_are_the_targets_layer_inputs():
    for attn in ("sdpa", "eager"):  # the lean forward and HF's
        target = tiny_lm("qwen3" if attn == "sdpa" else "llama", attn, layers=5)
        engine = SpecEngine(target, None, EngineConfig(max_batch_size=4, max_seq_len=40, gamma=3, drafters=("eagle3",),
                                                       eagle3_layers=(1, 3, 4)))
        steps = engine.generate_steps(PROMPTS[:4], SamplingParams(max_new_tokens=12, temperature=1.0, seed=0))
        for _ in range(3):
            next(steps)
        rows = engine.rows
        assert rows.hidden.shape[-1] == 3 * target.config.hidden_size
        for b in range(4):
            length = int(rows.seq_len[b])
            with torch.no_grad():
                states = target.model(rows.tokens[b : b + 1, : length - 1], output_hidden_states=True).hidden_states
            expected = torch.cat([states[i][0] for i in (1, 3, 4)], -1)  # [S-1, 3H]
            torch.testing.assert_close(rows.hidden[b, : length - 1], expected, atol=1e-5, rtol=1e-4)


def test_an_engine_without_eagle3_captures_the_last_state_only():
    target = tiny_lm("llama", "sdpa", layers=4)
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=2, max_seq_len=40, gamma=3, drafters=("eagle",)))
    assert engine.target.capture_layers is None and engine.rows.hidden.shape[-1] == target.config.hidden_size
    assert SpecEngine(target, None, EngineConfig(max_batch_size=2, max_seq_len=40, gamma=3)).rows.hidden is None


@pytest.mark.parametrize("options", [{}, dict(norm_output=True, fusion_norm="per_layer"),
                                     dict(norm_before_residual=True, fusion_norm="joint")],
                         ids=["plain", "norm_output+fc_norm", "norm_before_residual+norm_before_fc"])
def test_cached_drafts_have_the_q_of_the_training_time_test(options):
    target = tiny_lm("llama", "sdpa", layers=4)
    fresh = Eagle3Head.for_target(target.config, seed=3)
    head = Eagle3Head(fresh.hidden_size, fresh.target_layers, fresh.num_heads, fresh.num_kv_heads, fresh.head_dim,
                      fresh.gate_proj.weight.shape[0], **options)
    engine = SpecEngine(target, head, EngineConfig(max_batch_size=3, max_seq_len=40, gamma=4))
    steps = engine.generate_steps([PROMPTS[1], PROMPTS[5], PROMPTS[7]],
                                  SamplingParams(max_new_tokens=15, temperature=1.0, seed=1))
    next(steps)
    next(steps)  # the head's cache holds two steps' real pairs and is one step behind
    rows, drafter = engine.rows, engine.drafter
    proposal = drafter.propose(slice(0, 3), rows, 3, SamplingParams(max_new_tokens=1), lambda q, i: q.argmax(-1))
    objective = objective_for(drafter.head, target.get_input_embeddings(), target.get_output_embeddings())
    for b in range(3):
        length = int(rows.seq_len[b])  # the drafts as if kept: the teacher-forced tokens of the test
        tokens = torch.cat([rows.tokens[b, :length], proposal.drafts[b]])[None]
        hidden = torch.zeros(1, tokens.shape[1] - 1, rows.hidden.shape[-1])
        hidden[0, : length - 1] = rows.hidden[b, : length - 1]  # real states where the engine has them
        with torch.no_grad():
            log_q = objective(drafter.head, FeatureBatch(tokens, hidden, None, None, None), 1.0).log_q
        for depth in range(3):  # step `depth` of the test predicts token length + depth
            torch.testing.assert_close(log_q[0, depth, length + depth].exp(), proposal.q.probs[b, depth],
                                       atol=1e-5, rtol=1e-4)


def test_trained_online_it_drafts_better_and_stays_exact():
    target = tiny_lm("llama", "sdpa", layers=4)
    head = Eagle3Head.for_target(target.config, seed=0, ttt_steps=2)
    config = EngineConfig(max_batch_size=8, max_seq_len=48, gamma=3, drafters=("eagle3",), record_signals=True)
    engine = SpecEngine(target, head, config)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=2)  # rollouts of the fresh head to learn from
    learner = HeadLearner(head, target.get_input_embeddings(), target.get_output_embeddings(),
                          LearnerConfig(lr=3e-3, max_steps=60, batch_size=8, warmup_steps=0, gate_z=0.0))
    learner.add_rollouts(engine.generate(make_prompts(48, 2, 8, seed=3), params, n=2))
    assert learner.train_round().published and learner.version == 1
    trained = Eagle3Head.for_target(target.config, seed=9, ttt_steps=2)
    trained.load_state_dict(learner.published_version().weights)
    acceptance = []
    for drafter in (Eagle3Head.for_target(target.config, seed=0, ttt_steps=2), trained):
        fresh_engine = SpecEngine(target, drafter, config)
        fresh_engine.generate(make_prompts(24, 2, 8, seed=4), params)
        acceptance.append(fresh_engine.stats.acceptance_rate)
    assert acceptance[1] > acceptance[0] + 0.05
    assert speculative(target, trained) == plain(target)


def test_paged_cache_and_chunked_prefill_stay_exact():
    """The captured states follow the target's prefill chunks and its paged K/V like the last state does."""
    target = tiny_lm("llama", "sdpa", layers=4)
    assert speculative(target, kv_cache="paged", kv_block_size=4, prefill_chunk_tokens=8) == plain(target)


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "attn", "layers"), [("llama", "sdpa", 4), ("llama", "eager", 4),
                                                      ("qwen2", "sdpa", 6), ("qwen3", "sdpa", 5)])
def test_trained_head_is_exact_on_each_architecture(arch, attn, layers):
    target = tiny_lm(arch, attn, layers=layers)
    head = Eagle3Head.for_target(target.config, seed=0, ttt_steps=2)
    config = EngineConfig(max_batch_size=8, max_seq_len=48, gamma=3, drafters=("eagle3",), record_signals=True)
    learner = HeadLearner(head, target.get_input_embeddings(), target.get_output_embeddings(),
                          LearnerConfig(lr=3e-3, max_steps=30, batch_size=8, warmup_steps=0, gate_z=0.0))
    learner.add_rollouts(SpecEngine(target, head, config).generate(
        make_prompts(32, 2, 8, seed=3), SamplingParams(max_new_tokens=24, temperature=1.0, seed=2), n=2))
    assert learner.train_round().published
    trained = Eagle3Head.for_target(target.config, seed=9, ttt_steps=2)
    trained.load_state_dict(learner.published_version().weights)
    assert speculative(target, trained) == plain(target)


def test_own_lm_head_over_draft_ids_is_exact_and_drafts_only_those(monkeypatch):
    target = tiny_lm("llama", "sdpa", layers=4)
    ids = torch.arange(0, 64, 2)  # half the vocabulary: the target emits ids the head cannot propose
    head = Eagle3Head.for_target(target.config, seed=1, draft_ids=ids)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight[ids])
    assert speculative(target, head) == plain(target)
    engine = SpecEngine(target, head, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=3, draft_vocab=40))
    first = engine.draft_vocab()  # the subset set (the first 40 ids and EOS); the head drafts the ids both share
    assert first.numel() == 40 and torch.equal(engine.drafter.draws.vocab.ids, ids[torch.isin(ids, first)])
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)] == plain(target)
    trees = SpecEngine(target, head, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=3, tree_width=2))
    grown = []
    monkeypatch.setattr(eagle, "grow_tree", lambda *a, **k: grown.append(grow_tree(*a, **k)) or grown[-1])
    assert [r.completion_ids for r in trees.generate(PROMPTS, GREEDY)] == plain(target)
    assert grown and all(torch.isin(g.drafts, ids).all() for g in grown)  # trees over its own ids only
    with pytest.raises(ValueError, match="shares none with the drafter's own LM head"):
        engine.set_draft_vocab(DraftVocab(torch.as_tensor([1, 3, 5]), engine.vocab_size))


def test_default_layers_are_low_mid_high():
    assert default_layers(32) == (2, 16, 29)
    assert default_layers(24) == (2, 12, 21)
    assert default_layers(2) == (0, 1)


@pytest.mark.parametrize(("layers", "match"), [((1, 1, 3), "distinct sorted"), ((3, 1), "distinct sorted"),
                                               ((1, 9), r"invalid for a target of 4 layers")])
def test_bad_layers_are_refused_naming_them(layers, match):
    target = tiny_lm("llama", "sdpa", layers=4)
    with pytest.raises(ValueError, match=match):
        SpecEngine(target, None, EngineConfig(max_batch_size=2, max_seq_len=40, drafters=("eagle3",),
                                              eagle3_layers=layers))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(VERIFIED_MODEL_TYPES))
def test_greedy_exact_on_every_verified_architecture(model_type):
    target = tiny_model(model_type)
    rows = sweep_prompts(2)
    config = dict(max_batch_size=3, max_seq_len=40, gamma=3, drafters=("eagle3",), cost_model_budget_s=0.3)
    expected = plain(target, rows)
    assert [r.completion_ids for r in SpecEngine(target, None, EngineConfig(**config)).generate(rows, GREEDY)] \
        == expected


def test_yaml_selects_eagle3_and_its_layers(tmp_path):
    from specroll.integrations.yaml_config import ConfigError, load_config

    path = tmp_path / "engine.yaml"
    path.write_text("drafters: [eagle3, suffix]\neagle3_layers: [1, 2, 3]\neagle3_ttt_steps: 4\n")
    config = load_config(path, EngineConfig)
    assert config.drafters == ("eagle3", "suffix") and config.eagle3_layers == (1, 2, 3)
    assert SpecEngine(tiny_lm("llama", "sdpa", layers=4), None, config).drafter.model.head.ttt_steps == 4
    path.write_text("drafters: [eagle3]\neagle3_layers: [3, 1]\n")
    with pytest.raises(ConfigError, match="eagle3_layers"):
        load_config(path, EngineConfig)
    path.write_text("drafters: [eagle3, eagle]\n")
    with pytest.raises(ConfigError, match="at most one of"):
        load_config(path, EngineConfig)
