"""What each layer of a model writes per token, probed once: `probe_layer_shapes` and the shapes it returns.

Configs do not say it reliably (Falcon's multi-query attention, MLA's K and V of different head dims, Gemma 4's
full and sliding layers), so one 1-token forward through HF's own `DynamicCache` is read instead
(`cache.RaggedKVCache`'s docstring says what each shape becomes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import CacheLayerMixin, DynamicCache, LinearAttentionCacheLayerMixin

from .hf_compat import cache_kwargs
from .recurrent.linear_state import StateShape


@dataclass(frozen=True)
class LayerShape:
    """What one attention layer writes per token: K/V heads, and the head dims of K and of V."""

    num_heads: int
    key_dim: int
    value_dim: int


@dataclass(frozen=True)
class HybridShape:
    """A layer that writes attention K/V and keeps a recurrent state (Falcon-H1's parallel mixers)."""

    attention: LayerShape
    state: StateShape


@torch.inference_mode()
def probe_layer_shapes(model: PreTrainedModel) -> list[LayerShape | StateShape | HybridShape | None]:
    """Each cache layer's `LayerShape` (`StateShape` for a linear-attention layer, `HybridShape` for
    one with both, None where the layer writes nothing), from one 1-token forward.

    Raises `ValueError` for a recurrent layer whose state is not one conv window and one recurrent
    matrix (e.g. a conv-only layer, or several states per layer).
    """
    probe = DynamicCache(config=model.config)
    ids = torch.zeros(1, 1, dtype=torch.long, device=model.get_input_embeddings().weight.device)
    model(input_ids=ids, position_ids=torch.zeros_like(ids), use_cache=True, **cache_kwargs(model, probe))
    return [_layer_shape(model, index, layer) for index, layer in enumerate(probe.layers)]


def _layer_shape(model: PreTrainedModel, index: int, layer: CacheLayerMixin
                 ) -> LayerShape | StateShape | HybridShape | None:
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    attention = None if keys is None or keys.numel() == 0 else LayerShape(keys.shape[1], keys.shape[3],
                                                                            values.shape[3])
    if not isinstance(layer, LinearAttentionCacheLayerMixin):
        return attention
    conv, state = layer.conv_states.get(0), layer.recurrent_states.get(0)
    if layer.number_of_states != 1 or conv is None or state is None:
        raise ValueError(
            f"{model.config.model_type!r} layer {index} keeps a recurrent/conv state ({type(layer).__name__}) "
            "the ragged cache cannot hold: it holds attention K/V, and one conv window and one recurrent state"
        )
    state_shape = StateShape(conv.shape[1], conv.shape[2], tuple(state.shape[1:]), state.dtype)
    return state_shape if attention is None else HybridShape(attention, state_shape)
