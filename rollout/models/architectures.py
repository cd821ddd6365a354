"""Which model architectures the engine runs, checked when a `SpecEngine` is built.

The engine drives HF's own forward with a ragged cache, per-row positions and a 4D mask it builds
itself (`runner`, `cache`). Whether an architecture honours all three is not something its config
can tell: a model may take positions from the cache length, build its own mask (ALiBi), keep
recurrent state, or cache K/V through its own API — and then it produces wrong tokens without an
error. So the engine runs only the `model_type`s that the architecture sweep
(`python -m specroll.tools.arch_sweep`, and tests/test_architectures.py over this list) has
verified exact: greedy plain and speculative decoding equal HF `generate` on ragged prompts past
the sliding window. Anything else is refused at construction unless the caller opts out with
`EngineConfig(allow_unverified_architectures=True)`; `KNOWN_GAPS` says why a popular family is
not on the list.

An attention implementation other than eager or sdpa is always refused: flash and flex attention
ignore the 4D mask the runner passes (with it, every row would attend to every slot).
"""

from __future__ import annotations

from transformers import PreTrainedModel

VERIFIED_MODEL_TYPES = frozenset({
    # the families the project commits to
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "gemma4_text", "phi3", "deepseek_v2", "deepseek_v3", "olmo2", "gpt_neox", "falcon", "gpt2",
    # other popular decoders the sweep finds exact
    "cohere", "cohere2", "ernie4_5", "exaone4", "gemma3", "gemma4", "glm", "glm4", "glm4_moe", "gpt_bigcode",
    "gpt_oss", "granite", "granitemoe", "helium", "hunyuan_v1_dense", "internlm3", "ministral", "ministral3", "olmo",
    "olmo3", "olmoe", "opt", "phi", "phimoe", "seed_oss", "smollm3", "stablelm", "starcoder2",
    # recurrent layers with per-row state in the ragged cache (models.mixers): Gated DeltaNet, Mamba, Mamba-2
    "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "mamba", "falcon_mamba", "mamba2",
    "falcon_h1", "nemotron_h", "bamba", "granitemoehybrid",
})

# Why a family users ask for is not verified (what is missing); other types are simply not swept.
_RECURRENT = ("keep a recurrent/conv state per row, which the ragged cache holds only for the mixers it has a "
              "ragged forward for (models.mixers: Gated DeltaNet, Mamba, Mamba-2)")
KNOWN_GAPS = {
    "recurrent_gemma": f"its RG-LRU layers {_RECURRENT}",
    "bloom": "ALiBi: the forward builds its own bias and rejects the runner's 4D mask",
}
EXACT_ATTENTION = ("eager", "sdpa")


def unverified_reason(model: PreTrainedModel) -> str | None:
    """None if the engine's exactness on `model`'s architecture is verified, else what is missing."""
    model_type = model.config.model_type
    if model_type in VERIFIED_MODEL_TYPES:
        return None
    gap = KNOWN_GAPS.get(model_type, "not verified by the architecture sweep (specroll.tools.arch_sweep)")
    return f"model_type {model_type!r}: {gap}"


def check_architecture(model: PreTrainedModel, role: str, allow_unverified: bool = False) -> None:
    """Raise `ValueError` if the engine cannot vouch for `model` (`role`: "target" or "drafter")."""
    attn = model.config._attn_implementation
    if attn not in EXACT_ATTENTION:
        raise ValueError(
            f"{role} attn_implementation={attn!r} is not supported: the engine's ragged 4D mask needs one of "
            f"{', '.join(EXACT_ATTENTION)} (load the model with attn_implementation='sdpa')"
        )
    reason = unverified_reason(model)
    if reason is not None and not allow_unverified:
        raise ValueError(
            f"{role} {reason}; verified exact: {', '.join(sorted(VERIFIED_MODEL_TYPES))}. Pass "
            "EngineConfig(allow_unverified_architectures=True) to run it anyway (tokens may be silently wrong)"
        )
