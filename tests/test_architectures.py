"""Architectures: every allowlisted model type is exact, everything else is refused at construction.

`test_allowlisted_type_is_exact` is the default-suite part of the architecture sweep
(`specroll.tools.arch_sweep`): per type a tiny random fp32 model, ragged prompts of 1/5/9/13
tokens (past a 4-token sliding window where the type has one), greedy plain (γ = 0) and
speculative (γ = 3, the target itself, an unrelated random model, and that model with the suffix
drafter choosing per row as drafters) equal to HF
`generate` on each prompt alone. The full sweep over every causal-LM type is the module's CLI.
Hybrid (linear-attention) state and its rollback have their own tests: tests/test_linear_state.py.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from packaging import version
from tiny_models import tiny_lm
from transformers import CONFIG_MAPPING

from specroll.rollout import EngineConfig, SpecEngine
from specroll.rollout.models.architectures import VERIFIED_MODEL_TYPES
from specroll.rollout.models.runner import ModelRunner
from specroll.tools.arch_sweep import check_exact, tiny_model

CPU = torch.device("cpu")


# transformers before 5.18 (the GPU image's 5.17) lacks some types and keeps nemotron_h's recurrent state in a
# cache layer the ragged cache refuses at construction, with its reason: refused clearly there, not wrong tokens.
OLD_TRANSFORMERS = version.parse(transformers.__version__) < version.parse("5.18")


@pytest.mark.parametrize("model_type", sorted(VERIFIED_MODEL_TYPES))
def test_allowlisted_type_is_exact(model_type):
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no model type {model_type!r}")
    if OLD_TRANSFORMERS and model_type == "nemotron_h":
        with pytest.raises(ValueError, match=r"recurrent/conv state .* the ragged cache cannot hold"):
            check_exact(model_type)
        return
    assert check_exact(model_type) == []


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_unverified_type_is_refused_naming_type_and_gap(role):
    unverified = tiny_model("bloom")
    target, drafter = (unverified, tiny_lm()) if role == "target" else (tiny_lm(), unverified)
    with pytest.raises(ValueError, match=rf"{role} model_type 'bloom': ALiBi.*"
                                         r"allow_unverified_architectures=True"):
        SpecEngine(target, drafter, EngineConfig(max_batch_size=2, max_seq_len=16))


def test_opt_out_never_runs_a_model_the_cache_cannot_hold():
    # Allowed past the allowlist, a linear-attention layer the ragged cache has no forward for still
    # fails at construction, not with wrong tokens.
    with pytest.raises(ValueError, match=r"'olmo_hybrid' layers \[0\] keep a recurrent/conv state"):
        SpecEngine(tiny_model("olmo_hybrid"), None, EngineConfig(max_batch_size=2, max_seq_len=16,
                                                                 allow_unverified_architectures=True))


def test_opt_out_runs_an_unverified_attention_model():
    model = tiny_model("biogpt")
    with pytest.raises(ValueError, match="'biogpt': not verified"):
        SpecEngine(model, None, EngineConfig(max_batch_size=2, max_seq_len=16))
    SpecEngine(model, None, EngineConfig(max_batch_size=2, max_seq_len=16, allow_unverified_architectures=True))


def test_attention_that_ignores_the_mask_is_refused():
    model = tiny_model("llama")
    model.config._attn_implementation_internal = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation='flex_attention'"):
        SpecEngine(model, None, EngineConfig(max_batch_size=2, max_seq_len=16, allow_unverified_architectures=True))


def test_flag_must_be_a_bool():
    with pytest.raises(ValueError, match="allow_unverified_architectures"):
        EngineConfig(allow_unverified_architectures="yes")


def kv_dims(model_type: str) -> set[tuple[int, int, int]]:
    cache = ModelRunner(tiny_model(model_type), batch=2, length=8, dtype=torch.float32, device=CPU).cache
    return {(layer.keys.shape[1], layer.keys.shape[3], layer.values.shape[3]) for layer in cache.buffered_layers}


def test_cache_shapes_come_from_the_layers():
    # (K/V heads, K head dim, V head dim) per layer, as each layer writes them.
    assert kv_dims("falcon") == {(1, 8, 8)}  # multi-query: 1 K/V head, whatever num_kv_heads says
    # MLA: HF caches the compressed latent (kv_lora_rank 16) and the shared rotary key (qk_rope_head_dim 8)
    # as one "head" of K and of V, not the 4 heads x 16/12 dims the attention itself uses.
    assert kv_dims("deepseek_v2") == {(1, 16, 8)}
    assert kv_dims("gemma4_text") == {(2, 8, 8), (2, 16, 16)}  # sliding and full layers: other head dims
