"""The trainer-side walk (`policy_sync`): a plain model's weights are read without a copy; a PEFT LoRA model is
merged one layer at a time (never two at once), its merged weights equal `merge_and_unload`'s, and every layer
is unmerged after the walk, also one stopped midway. The ZeRO-3 gather of the same walk runs on real DeepSpeed
in `test_sync_zero3_peft.py` (slow)."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import build_lm

from specroll.integrations.trl_hook.policy_sync import gather_policy_weights, iter_policy_weights

peft = pytest.importorskip("peft")


def lora_model(seed: int = 0):
    """A 2-layer llama with LoRA on q/v (B random, so merging moves the weights) and a saved `lm_head`."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                             init_lora_weights=False, modules_to_save=["lm_head"])
    return peft.get_peft_model(build_lm(hidden=32, layers=2, seed=seed), config)


def lora_layers(model) -> list:
    return [m for m in model.modules() if hasattr(m, "merged") and hasattr(m, "lora_A")]


def test_plain_model_weights_are_the_parameters_themselves():
    model = build_lm(hidden=32, layers=2, seed=0)
    named = gather_policy_weights(model)
    params = dict(model.named_parameters())
    assert named.keys() == params.keys()
    assert all(named[name].data_ptr() == params[name].data_ptr() for name in named)


def test_lora_merged_weights_equal_merge_and_unload():
    model = lora_model()
    merged = copy.deepcopy(model).merge_and_unload()
    named = gather_policy_weights(model)
    assert named.keys() == {name for name, _ in merged.named_parameters()}
    for name, param in merged.named_parameters():
        torch.testing.assert_close(named[name], param.detach(), rtol=0, atol=1e-7)
    base_q = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.allclose(named["model.layers.0.self_attn.q_proj.weight"], base_q)


def test_lora_layers_merge_one_at_a_time_and_unmerge():
    model = lora_model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    layers = lora_layers(model)
    merged_at_once = [sum(layer.merged for layer in layers) for _ in iter_policy_weights(model)]
    assert max(merged_at_once) == 1 and len(layers) == 4
    assert not any(layer.merged for layer in layers)
    for name, param in model.named_parameters():  # unmerging subtracts what merging added: float rounding only
        torch.testing.assert_close(param.detach(), before[name], rtol=0, atol=1e-6)


def test_a_walk_stopped_midway_leaves_no_layer_merged():
    model = lora_model()
    walk = iter_policy_weights(model)
    for item in walk:
        if item.transient:  # inside the first LoRA layer, merged now
            break
    assert any(layer.merged for layer in lora_layers(model))
    walk.close()
    assert not any(layer.merged for layer in lora_layers(model))
