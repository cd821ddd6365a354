"""The drafters that read the policy (layer-skip, EAGLE-style head, Medusa heads): exact and consistent.

Greedy: each drafter, alone and with the suffix drafter's per-row choice, at fixed and auto γ, gives
plain decoding's tokens (HF's forward path for the heads, the lean one for all three). The plumbing:
the hidden states verification writes are the target's own (`last_hidden_state` of a row-alone HF
forward, 1e-5 in fp32), and the EAGLE head drafting through its ragged cache computes what its causal
training pass over the same pairs computes — so a head trained offline drafts what it learnt.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_prompts, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads

PROMPTS = make_prompts(12, 1, 9)  # one-token prompts included: a row with no hidden state yet
GREEDY = SamplingParams(max_new_tokens=20, temperature=0)
KINDS = [("layer_skip",), ("eagle",), ("medusa",), ("layer_skip", "suffix"), ("eagle", "suffix"),
         ("medusa", "suffix")]


def plain(target) -> list[list[int]]:
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=0))
    return [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kinds", KINDS, ids="+".join)
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_greedy_equals_plain_decoding(kinds, gamma, attn):
    target = tiny_lm("llama", attn, layers=3)
    if attn == "eager" and "layer_skip" in kinds:  # layer-skip runs on the lean forward (sdpa) only: refused
        with pytest.raises(ValueError, match="layer_skip' needs the lean forward"):
            SpecEngine(target, None, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=gamma, drafters=kinds))
        return
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=gamma, drafters=kinds,
                                                   cost_model_budget_s=0.3))
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)] == plain(target)


def test_hidden_states_are_the_targets():
    target = tiny_lm("qwen3", "sdpa", layers=3)
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=4, max_seq_len=40, gamma=3, drafters=("medusa",)))
    steps = engine.generate_steps(PROMPTS[:4], SamplingParams(max_new_tokens=12, temperature=1.0, seed=0))
    for _ in range(3):
        next(steps)
    rows = engine.rows
    for b in range(4):
        length = int(rows.seq_len[b])
        with torch.no_grad():
            expected = target.model(rows.tokens[b : b + 1, : length - 1]).last_hidden_state[0]  # [S-1, H]
        torch.testing.assert_close(rows.hidden[b, : length - 1], expected, atol=1e-5, rtol=1e-4)


def test_eagle_cached_drafting_matches_its_training_pass():
    target = tiny_lm("llama", "sdpa", layers=2)
    head = EagleHead.for_target(target.config, seed=3)
    engine = SpecEngine(target, head, EngineConfig(max_batch_size=3, max_seq_len=40, gamma=4))
    steps = engine.generate_steps([PROMPTS[1], PROMPTS[5], PROMPTS[7]],
                                  SamplingParams(max_new_tokens=15, temperature=1.0, seed=1))
    next(steps)
    next(steps)  # the head's cache holds the real pairs of two steps (and is one step behind)
    rows, drafter = engine.rows, engine.drafter
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    proposal = drafter.propose(slice(0, 3), rows, 2, SamplingParams(max_new_tokens=1), lambda q, i: q.argmax(-1))
    for b in range(3):
        length = int(rows.seq_len[b])
        with torch.no_grad():  # pairs (h_t, x_{t+1}), t = 0..S-2, then (predicted h_{S-1}, first draft)
            real = drafter.head(embed(rows.tokens[b : b + 1, 1:length]), rows.hidden[b : b + 1, : length - 1],
                                torch.arange(length - 1)[None])[0]  # [S-1, H]
            tokens = torch.cat([rows.tokens[b, 1:length], proposal.drafts[b, :1]])[None]
            features = torch.cat([rows.hidden[b, : length - 1], real[-1:]])[None]
            both = drafter.head(embed(tokens), features, torch.arange(length)[None])[0]  # [S, H]
        torch.testing.assert_close(proposal.q.probs[b, 0], lm_head(real[-1]).softmax(-1), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(proposal.q.probs[b, 1], lm_head(both[-1]).softmax(-1), atol=1e-5, rtol=1e-4)


def test_medusa_fresh_heads_predict_the_targets_next_token():
    """W = 0: every head's feature is h itself, so its distribution is the target's at that position."""
    heads = MedusaHeads(8, 3)
    h = torch.randn(5, 8)
    torch.testing.assert_close(heads(h), h[:, None].expand(5, 3, 8))


def test_heads_need_the_right_kind():
    target = tiny_lm("llama", "sdpa", layers=2)
    with pytest.raises(ValueError, match="drafts as 'eagle'"):
        SpecEngine(target, EagleHead.for_target(target.config), EngineConfig(drafters=("medusa",)))
    with pytest.raises(ValueError, match="at most one of"):
        EngineConfig(drafters=("eagle", "medusa"))
    with pytest.raises(ValueError, match="layer_skip_layers=2"):
        SpecEngine(target, None, EngineConfig(drafters=("layer_skip",), layer_skip_layers=2))


def test_yaml_selects_the_drafters(tmp_path):
    from specroll.integrations.yaml_config import ConfigError, load_config

    path = tmp_path / "engine.yaml"
    path.write_text("drafters: [eagle, suffix]\nlayer_skip_layers: 3\nmedusa_heads: 2\n")
    config = load_config(path, EngineConfig)
    assert config.drafters == ("eagle", "suffix") and config.layer_skip_layers == 3 and config.medusa_heads == 2
    path.write_text("drafters: [eagle, layer_skip]\n")
    with pytest.raises(ConfigError, match="at most one of"):
        load_config(path, EngineConfig)


def test_the_eagle_heads_width_comes_from_its_weights(tmp_path):
    """A fresh head is `eagle_intermediate_size` wide (None: the target's); a trained one loads at its own
    width, and a config that names another is refused before anything runs."""
    from specroll.integrations.model_source import ModelPaths, load_drafter

    target = tiny_lm("llama", "sdpa", layers=2)
    fresh = SpecEngine(target, None, EngineConfig(drafters=("eagle",), eagle_intermediate_size=24, max_seq_len=40))
    assert fresh.drafter.head.gate_proj.weight.shape[0] == 24
    with pytest.raises(ValueError, match="eagle_intermediate_size=0"):
        EngineConfig(eagle_intermediate_size=0)
    path = tmp_path / "eagle.pt"
    torch.save(EagleHead.for_target(target.config, intermediate_size=24).state_dict(), path)
    models = ModelPaths("unused", head=str(path))
    head = load_drafter(models, EngineConfig(drafters=("eagle",)), target)
    assert head.gate_proj.weight.shape[0] == 24
    with pytest.raises(ValueError, match="does not match the head at models"):
        load_drafter(models, EngineConfig(drafters=("eagle",), eagle_intermediate_size=48), target)
