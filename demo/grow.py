"""Function-preserving growth of a small Llama into a wider, deeper one (Net2Net-style).

Why: on a 2-core CPU a 33M-parameter model trains at ~600 tokens/s — hours to learn the demo task —
while a 4M one learns it in minutes. The demo needs the big model's *decode cost* (so speculation
pays) and the small model's *skill*; growing the trained core gives both, and a short fine-tune at
full size plus GRPO then train every parameter.

How, for a residual stream of width d_s grown to d_b (zero-padding, not Net2Net's neuron copying):

- Embeddings (and a tied LM head) keep the core's rows in the first d_s dims, zeros elsewhere, so
  the big residual stream is `[x_core, 0]` throughout.
- RMSNorm over d_b dims of `[x, 0]` sees mean(x²)·d_s/d_b: norm weights are scaled by
  sqrt(d_s/d_b) and eps by d_s/d_b, which makes every norm output exactly the core's.
- Extra heads and MLP units keep their random input weights but get zero output weights (o_proj
  columns, down_proj columns), and nothing writes to the extra dims (zero o_proj / down_proj rows).
- Extra layers are identities the same way: random inputs, zero o_proj and down_proj. The core's
  layers are spread evenly among them.

Departures from Net2Net: zeros instead of duplicated units (no symmetry to break — the extra units
start random), and deepening by zero-output residual blocks rather than identity-initialised MLPs.
"""

from __future__ import annotations

import copy
import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def grown_config(core: LlamaConfig, hidden_size: int, num_layers: int, num_heads: int,
                 intermediate_size: int) -> LlamaConfig:
    """The big model's config: the core's, resized, with eps rescaled so norms match exactly."""
    if core.num_key_value_heads != core.num_attention_heads:
        raise ValueError("core uses grouped-query attention: growth supports multi-head attention only")
    config = copy.deepcopy(core)
    config.hidden_size = hidden_size
    config.num_hidden_layers = num_layers
    config.num_attention_heads = config.num_key_value_heads = num_heads
    config.intermediate_size = intermediate_size
    config.head_dim = core.hidden_size // core.num_attention_heads
    config.rms_norm_eps = core.rms_norm_eps * core.hidden_size / hidden_size
    if config.head_dim != hidden_size // num_heads:
        raise ValueError(
            f"hidden_size={hidden_size}, num_heads={num_heads} is invalid: head_dim {hidden_size // num_heads} "
            f"must equal the core's {config.head_dim}"
        )
    return config


@torch.no_grad()
def grow(core: LlamaForCausalLM, config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    """A model with `config` computing exactly what `core` computes (up to float rounding)."""
    torch.manual_seed(seed)
    big = LlamaForCausalLM(config).to(core.dtype)
    d_s = core.config.hidden_size
    scale = math.sqrt(d_s / config.hidden_size)
    _pad_into(big.model.embed_tokens.weight, core.model.embed_tokens.weight, zero_rest=True)
    if not config.tie_word_embeddings:
        _pad_into(big.lm_head.weight, core.lm_head.weight, zero_rest=True)
    _norm_into(big.model.norm.weight, core.model.norm.weight, scale)
    core_layers = core.model.layers
    slots = {round(i * config.num_hidden_layers / len(core_layers)): layer for i, layer in enumerate(core_layers)}
    for j, layer in enumerate(big.model.layers):
        src = slots.get(j)
        attn, mlp = layer.self_attn, layer.mlp
        if src is None:  # an identity block: random inputs, nothing written to the residual stream
            attn.o_proj.weight.zero_()
            mlp.down_proj.weight.zero_()
            continue
        _norm_into(layer.input_layernorm.weight, src.input_layernorm.weight, scale)
        _norm_into(layer.post_attention_layernorm.weight, src.post_attention_layernorm.weight, scale)
        for name in ("q_proj", "k_proj", "v_proj"):
            _pad_into(getattr(attn, name).weight, getattr(src.self_attn, name).weight, zero_rest=False)
        _pad_into(attn.o_proj.weight, src.self_attn.o_proj.weight, zero_rest=True)
        for name in ("gate_proj", "up_proj"):
            _pad_into(getattr(mlp, name).weight, getattr(src.mlp, name).weight, zero_rest=False)
        _pad_into(mlp.down_proj.weight, src.mlp.down_proj.weight, zero_rest=True)
    return big


def _pad_into(big: torch.Tensor, small: torch.Tensor, zero_rest: bool) -> None:
    """Copy `small` [r, c] into the top-left of `big` [R, C]; zero the rest when it is an output."""
    if zero_rest:
        big.zero_()
    big[: small.shape[0], : small.shape[1]] = small


def _norm_into(big: torch.Tensor, small: torch.Tensor, scale: float) -> None:
    big.fill_(1.0)
    big[: small.shape[0]] = small * scale
