"""Scaled dot-product attention as every forward of ours calls it: GQA without K/V copies, and on CUDA the
kernels that suit a decode loop.

GQA: the `groups` query heads that share one K/V head are folded into its query axis ([n, Hkv, groups·Q, D];
query head h = kv·groups + g, as HF's `repeat_kv` pairs them), and the mask is repeated along that axis
(bool [n, 1, groups·Q, K], small) instead of K/V along heads — at Qwen2.5-7B, B = 256, 8k context a repeated K was
~14 GiB per layer for every verification and prefill.

CUDA: cuDNN's SDPA (torch's first choice for bf16 with a mask on Hopper) plans a graph for every new shape, and a
decode step's key length is new at every step: on an H200 (torch 2.11) it took 1.6 ms of host time per call, 69%
of the host time of a plain step of a 0.5B model at one row (device busy 4 ms of a 42 ms step). The
memory-efficient kernel takes a boolean mask and any length with no planning; flash serves the mask-free calls and
math what neither takes (`CUDA_SDPA_BACKENDS`). Raced against torch's own choice, stepped alternately on an H200
(`bench.gpu_check --stages sdpa`, after the GQA fold above): 1.01× at 1, 16 and 64 rows — it costs nothing,
and it no longer buys anything measured either (docs/drafters.md#gpu-check). A CPU is left to torch's choice.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def backends(device: torch.device) -> contextlib.AbstractContextManager:
    """The SDPA kernels allowed for a forward on `device` (module docstring): a context to run it in."""
    return sdpa_kernel(CUDA_SDPA_BACKENDS) if device.type == "cuda" else contextlib.nullcontext()


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, groups: int,
              scale: float | None = None, causal: bool = False) -> torch.Tensor:
    """SDPA of q [n, Hq, Q, D] over keys / values [n, Hkv, K, D] (Hq = groups · Hkv) → [n, Hq, Q, D].

    `mask` [n or 1, 1, Q, K] (bool: True where a query sees a key; or additive) or None; `causal` (with no mask):
    query q sees keys 0..q, torch's `is_causal` (top-left aligned)."""
    n, heads, q_len, dim = q.shape
    with backends(q.device):
        if groups == 1:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal, scale=scale)
        if causal:
            mask = torch.ones(q_len, keys.shape[-2], dtype=torch.bool, device=q.device).tril()[None, None]
        folded = q.reshape(n, heads // groups, groups * q_len, dim)  # [n, Hkv, groups·Q, D]
        if mask is not None and mask.shape[-2] > 1:
            mask = mask.repeat(1, 1, groups, 1)  # [·, 1, groups·Q, K]: query (g, q) sees what query q sees
        out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scale)
        return out.reshape(n, heads, q_len, dim)
