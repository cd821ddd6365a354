"""A DFlash checkpoint in z-lab's layout loads through `models:` and drafts exactly the checkpoint's q.

The checkpoint is written here, by hand, in the layout read from z-lab/dflash at commit 44947fb (`dflash/model.py`:
`DFlashDraftModel` on a Qwen3 config with `block_size`, `num_target_layers`, `dflash_config.{target_layer_ids,
mask_token_id}`; tensors `fc`, `hidden_norm`, `norm`, `layers.{i}.self_attn.*`, `layers.{i}.mlp.*`, `layers.{i}.*
layernorm`; docs/drafters.md). `reference_q` is DFlash's forward written out from those tensors alone (context =
hidden_norm(fc(target hidden_states[id + 1])), its K/V injected into every layer, the block bidirectional, q at the
mask positions through the target's LM head), so the test checks the layout and the math, not our code against
itself. Mismatched checkpoints are refused naming the field and both values.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tiny_models import make_prompts, tiny_lm

from specroll.integrations.model_source import ModelPaths, load_drafter
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads.block import BlockHead

LAYER_IDS, MASK_ID, BLOCK, DRAFT_LAYERS = [0, 2, 3], 63, 4, 2


def target():
    return tiny_lm("qwen3", "sdpa", layers=5)


def write_dflash(path, changes: dict | None = None, layer_ids=LAYER_IDS, seed: int = 0) -> None:
    text = target().config
    hidden, heads, kv, dim, width = text.hidden_size, 4, 2, 8, 48
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
              "num_hidden_layers": DRAFT_LAYERS, "num_attention_heads": heads, "num_key_value_heads": kv,
              "head_dim": dim, "intermediate_size": width, "vocab_size": text.vocab_size, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False, "max_position_embeddings": 256,
              "layer_types": ["full_attention"] * DRAFT_LAYERS, "block_size": BLOCK,
              "num_target_layers": text.num_hidden_layers, "tie_word_embeddings": False,
              "dflash_config": {"target_layer_ids": layer_ids, "mask_token_id": MASK_ID}, **(changes or {})}
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: (torch.randn(*shape, generator=g) * 0.3).to(torch.bfloat16)
    norm = lambda n: (1 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)
    tensors = {"fc.weight": rand(hidden, len(layer_ids) * hidden), "hidden_norm.weight": norm(hidden),
               "norm.weight": norm(hidden)}
    for i in range(DRAFT_LAYERS):
        p = f"layers.{i}."
        tensors |= {p + "self_attn.q_proj.weight": rand(heads * dim, hidden),
                    p + "self_attn.k_proj.weight": rand(kv * dim, hidden),
                    p + "self_attn.v_proj.weight": rand(kv * dim, hidden),
                    p + "self_attn.o_proj.weight": rand(hidden, heads * dim),
                    p + "self_attn.q_norm.weight": norm(dim), p + "self_attn.k_norm.weight": norm(dim),
                    p + "mlp.gate_proj.weight": rand(width, hidden), p + "mlp.up_proj.weight": rand(width, hidden),
                    p + "mlp.down_proj.weight": rand(hidden, width), p + "input_layernorm.weight": norm(hidden),
                    p + "post_attention_layernorm.weight": norm(hidden)}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))


def load(path, **engine) -> BlockHead:
    return load_drafter(ModelPaths(target="unused", head=str(path)), EngineConfig(drafters=("block",), **engine),
                        target())


def reference_q(path, tokens: torch.Tensor) -> torch.Tensor:
    """DFlash's block for a row of tokens (anchor = the last), from the checkpoint's tensors: q [k − 1, V] at T = 1."""
    from safetensors.torch import load_file

    w = {k: v.float() for k, v in load_file(str(path / "model.safetensors")).items()}
    model = target()
    rms = lambda x, name: F.rms_norm(x, x.shape[-1:], w[name], 1e-6)
    with torch.no_grad():
        states = model.model(tokens[None, :-1], output_hidden_states=True).hidden_states
        context = rms(torch.cat([states[i + 1][0] for i in LAYER_IDS], -1) @ w["fc.weight"].T, "hidden_norm.weight")
        embed = model.get_input_embeddings().weight
        x = torch.cat([embed[tokens[-1]][None], embed[MASK_ID][None].expand(BLOCK - 1, -1)])  # [k, H]
        c, n = context.shape[0], x.shape[0]
        inv = 1.0 / 10000.0 ** (torch.arange(0, 8, 2).float() / 8)
        ang = torch.arange(c + n).float()[:, None] * inv
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()  # [C + k, D]
        rot = lambda t, at: t * cos[at] + torch.cat([-t[..., 4:], t[..., :4]], -1) * sin[at]
        for i in range(DRAFT_LAYERS):
            p = f"layers.{i}."
            h = rms(x, p + "input_layernorm.weight")
            kv_in = torch.cat([context, h])
            q = F.rms_norm((h @ w[p + "self_attn.q_proj.weight"].T).view(n, 4, 8), (8,),
                           w[p + "self_attn.q_norm.weight"])
            k = F.rms_norm((kv_in @ w[p + "self_attn.k_proj.weight"].T).view(c + n, 2, 8), (8,),
                           w[p + "self_attn.k_norm.weight"])
            v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(c + n, 2, 8)
            q = rot(q.transpose(0, 1), slice(c, c + n))  # [4, k, D]
            k = rot(k.transpose(0, 1), slice(0, c + n)).repeat_interleave(2, 0)
            v = v.transpose(0, 1).repeat_interleave(2, 0)
            attn = F.scaled_dot_product_attention(q, k, v)  # no mask: the context and the whole block
            x = x + attn.transpose(0, 1).reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
            h = rms(x, p + "post_attention_layernorm.weight")
            x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
                @ w[p + "mlp.down_proj.weight"].T
        return model.lm_head(rms(x, "norm.weight")[1:]).softmax(-1)


def test_the_checkpoint_loads_by_name_and_drafts_its_q(tmp_path):
    write_dflash(tmp_path)
    head = load(tmp_path)
    assert head.target_layers == tuple(LAYER_IDS) and head.block_size == BLOCK and len(head.layers) == DRAFT_LAYERS
    torch.testing.assert_close(head.mask_embedding, target().get_input_embeddings().weight[MASK_ID])
    engine = SpecEngine(target(), head, EngineConfig(max_batch_size=3, max_seq_len=40, gamma=3))
    prompts = make_prompts(3, 3, 9, seed=5)
    steps = engine.generate_steps(prompts, SamplingParams(max_new_tokens=12, temperature=1.0, seed=3))
    next(steps)
    next(steps)
    rows = engine.rows
    proposal = engine.drafter.propose(slice(0, 3), rows, 3, SamplingParams(max_new_tokens=1), lambda q, i: q.argmax(-1))
    steps.close()
    for b in range(3):
        expected = reference_q(tmp_path, rows.tokens[b, : int(rows.seq_len[b])])
        torch.testing.assert_close(proposal.q.probs[b], expected, atol=2e-5, rtol=1e-4)


def test_the_loaded_checkpoint_is_greedy_exact(tmp_path):
    write_dflash(tmp_path)
    prompts, greedy = make_prompts(8, 1, 9, seed=6), SamplingParams(max_new_tokens=16, temperature=0)
    config = dict(max_batch_size=4, max_seq_len=40)
    plain = SpecEngine(target(), None, EngineConfig(**config, gamma=0)).generate(prompts, greedy)
    spec = SpecEngine(target(), load(tmp_path), EngineConfig(**config, gamma=3)).generate(prompts, greedy)
    assert [r.completion_ids for r in spec] == [r.completion_ids for r in plain]


@pytest.mark.parametrize(("changes", "layer_ids", "match"), [
    ({"hidden_size": 48}, LAYER_IDS, "hidden_size=48 in the checkpoint, 32 in the target"),
    ({"vocab_size": 128}, LAYER_IDS, "vocab_size=128 in the checkpoint, 64 in the target"),
    ({"num_target_layers": 36}, LAYER_IDS, "num_target_layers=36 in the checkpoint, 5 in the target"),
    ({}, [0, 2, 4], r"target_layer_ids=\[0, 2, 4\] in the checkpoint, the target's 5 layers give ids in \[0, 3\]"),
    ({"dflash_config": {"target_layer_ids": LAYER_IDS, "mask_token_id": 64}}, LAYER_IDS,
     "mask_token_id=64 in the checkpoint, the target's vocabulary has 64 ids"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, LAYER_IDS, "rope_scaling"),
])
def test_a_checkpoint_that_does_not_fit_is_refused_naming_the_field(tmp_path, changes, layer_ids, match):
    write_dflash(tmp_path, changes, layer_ids)
    with pytest.raises(ValueError, match=match):
        load(tmp_path)


def test_a_missing_tensor_and_engine_layers_that_disagree_are_refused(tmp_path):
    write_dflash(tmp_path)
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['layers.1.mlp.up_proj.weight'\]"):
        load(tmp_path)
    write_dflash(tmp_path)
    with pytest.raises(ValueError, match=r"engine.block_layers=\(1,\) does not match"):
        SpecEngine(target(), load(tmp_path), EngineConfig(max_batch_size=2, max_seq_len=40, block_layers=(1,)))
