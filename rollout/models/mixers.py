"""Ragged forwards for layers that keep a per-row state instead of K/V: which HF modules have one,
and how a model's modules are switched to it.

HF's recurrent mixers keep one state per row and return the state after the *last* fed token, so
over the engine's ragged right-padded rows and partial acceptances they leave wrong states
(`recurrent.linear_state`). Each family's ragged forward (`recurrent.gated_delta`,
`recurrent.mamba`) computes the same layer on the same weights per row, from the row's state at its
`start`, snapshotting the state after every real token. `install_ragged_mixers` sets a `RaggedMixer` as
the `forward` of every module of a known class: called with a `RaggedKVCache` it runs the ragged forward,
with anything else HF's own, so the model behaves as before outside the engine.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .cache import RaggedKVCache
from .hf_compat import cache_kwargs, pop_cache
from .recurrent.gated_delta import RAGGED_FORWARDS as GATED_DELTA_FORWARDS
from .recurrent.linear_state import RaggedStateLayer
from .recurrent.mamba import RAGGED_FORWARDS as MAMBA_FORWARDS

RaggedForward = Callable[[nn.Module, torch.Tensor, RaggedStateLayer], torch.Tensor]
RAGGED_FORWARDS: dict[type[nn.Module], RaggedForward] = {**GATED_DELTA_FORWARDS, **MAMBA_FORWARDS}


class RaggedMixer:
    """A recurrent mixer module's `forward`: the ragged one with a `RaggedKVCache`, HF's otherwise."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.ragged = RAGGED_FORWARDS[type(module)]

    def __call__(self, hidden_states: torch.Tensor, attention_mask=None, **kwargs) -> torch.Tensor:
        cache = pop_cache(kwargs)  # `cache`, or `past_key_values` / `cache_params` before transformers 5.18
        if not isinstance(cache, RaggedKVCache):
            return type(self.module).forward(self.module, hidden_states, attention_mask=attention_mask,
                                             **cache_kwargs(self.module, cache), **kwargs)
        return self.ragged(self.module, hidden_states, cache.states_by_layer[self.module.layer_idx])


def install_ragged_mixers(model: nn.Module) -> set[int]:
    """Give every known recurrent mixer of `model` the ragged forward; returns their layer indices."""
    covered = set()
    for module in model.modules():
        if type(module) in RAGGED_FORWARDS:
            if not isinstance(module.__dict__.get("forward"), RaggedMixer):
                module.forward = RaggedMixer(module)
            covered.add(module.layer_idx)
    return covered
