"""A drafter cut from the trained core: its embeddings, final norm and some of its layers.

Why: a 2-layer drafter trained from scratch for a minute lags far behind the core on this task
(greedy agreement with the target ~60%), while the core's own layers already compute what the
target computes — growth (`demo.grow`) preserves the core's function. Keeping evenly spaced layers,
first and last included, gives a drafter that starts close to the target; distillation on the
target's samples then closes the gap. This is the layer-skipping drafter of self-speculative
decoding (Draft & Verify, LayerSkip), made a separate small model.
"""

from __future__ import annotations

import copy

import torch
from transformers import LlamaForCausalLM


def kept_layers(num_core_layers: int, num_layers: int) -> list[int]:
    """Evenly spaced layer indices of the core, first and last included when two or more are kept."""
    if not 1 <= num_layers <= num_core_layers:
        raise ValueError(f"num_layers={num_layers} is invalid: an int in [1, {num_core_layers}]")
    if num_layers == 1:
        return [0]
    return [round(i * (num_core_layers - 1) / (num_layers - 1)) for i in range(num_layers)]


@torch.no_grad()
def truncate(core: LlamaForCausalLM, num_layers: int) -> LlamaForCausalLM:
    """A copy of `core` with only `num_layers` of its decoder layers (same width, same tokenizer)."""
    keep = kept_layers(core.config.num_hidden_layers, num_layers)
    drafter = copy.deepcopy(core)
    drafter.model.layers = torch.nn.ModuleList([drafter.model.layers[i] for i in keep])
    for new_index, layer in enumerate(drafter.model.layers):
        layer.self_attn.layer_idx = new_index
    drafter.config.num_hidden_layers = num_layers
    if getattr(drafter.config, "layer_types", None):
        drafter.config.layer_types = [drafter.config.layer_types[i] for i in keep]
    return drafter
