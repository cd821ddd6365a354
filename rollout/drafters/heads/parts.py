"""What several heads share: their attention over the ragged cache or causally (`attend`: projections, RoPE, GQA),
the RMSNorm in fp32 (`normed`) and reading a target config's attribute that may be per-layer (`config_value`).
Used by `eagle.EagleHead`, `eagle3.Eagle3Head` and `block.BlockHead`."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...models.attention import attention
from ...models.lean import rotate_half

# kv(k, v) → (keys, values) to attend over: the ragged cache's update, or None for a causal pass.
KVWrite = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def attend(head: nn.Module, h: torch.Tensor, positions: torch.Tensor, kv: KVWrite | None,
           mask: torch.Tensor | None) -> torch.Tensor:
    """A head's self-attention over inputs h [n, Q, ·] at `positions` [n, Q] → [n, Q, Hq·D] (before `o_proj`):
    its q/k/v projections (and per-head q/k norms where it has them, Qwen3-style), plain RoPE from its
    `inv_freq`, GQA. With `kv` (the cache's write) attends over what it returns under `mask` [n, 1, Q, K]
    (bool, or `mask` alone without `kv`); with neither, over the Q inputs causally."""
    n, q_len, _ = h.shape
    q = head.q_proj(h).view(n, q_len, head.num_heads, head.head_dim)
    k = head.k_proj(h).view(n, q_len, head.num_kv_heads, head.head_dim)
    if getattr(head, "q_norm", None) is not None:
        q, k = normed(head.q_norm, q), normed(head.k_norm, k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # [n, Hq, Q, D], [n, Hkv, Q, D]
    v = head.v_proj(h).view(n, q_len, head.num_kv_heads, head.head_dim).transpose(1, 2)
    angles = positions[..., None].float() * head.inv_freq  # [n, Q, D/2]
    cos, sin = (torch.cat([angles, angles], -1)[:, None].to(q.dtype) for angles in (angles.cos(), angles.sin()))
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    if kv is not None:
        k, v = kv(k, v)  # [n, Hkv, K, D]
    causal = kv is None and mask is None
    attn = attention(q, k, v, mask, head.num_heads // head.num_kv_heads, causal=causal)  # [n, Hq, Q, D]
    return attn.transpose(1, 2).reshape(n, q_len, -1)


def normed(norm: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """`norm(x)`, computed in fp32 and returned in x's dtype: under the learner's bf16 autocast x is bf16 and the
    norm's weight fp32, which the fused kernel refuses (and a norm is where bf16 loses the most); in fp32 it is
    `norm(x)` exactly."""
    return F.rms_norm(x.float(), norm.normalized_shape, norm.weight.float(), norm.eps).to(x.dtype)


def attention_geometry(text) -> tuple[int, int, int, float]:
    """(heads, head_dim, kv_heads, rope theta) of a fresh head's own attention, from the target's text config: the
    target's geometry where its config has one for every layer, else 64-wide heads (an attention-free target:
    Mamba; a per-layer geometry: Gemma 4)."""
    heads = config_value(text, "num_attention_heads") or max(1, text.hidden_size // 64)
    head_dim = config_value(text, "head_dim") or text.hidden_size // heads
    kv_heads = config_value(text, "num_key_value_heads") or heads
    theta = config_value(text, "rope_theta") or (config_value(text, "rope_parameters") or {}).get(
        "rope_theta", 10000.0)
    return heads, head_dim, kv_heads, theta


def config_value(config, name: str):
    """`config.name`, or None where it has none or none that holds for every layer (transformers raises its
    `AmbiguousGlobalPerLayerAttributeError`, a RuntimeError, for a per-layer attribute of a heterogeneous config)."""
    try:
        return getattr(config, name, None)
    except RuntimeError:
        return None
