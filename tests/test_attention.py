"""`models.attention.attention`, the SDPA every forward of ours calls (the lean forward, the EAGLE / EAGLE-3 /
block heads): GQA folded into the query axis gives what K/V repeated along heads (HF's `repeat_kv`) gives, under a
ragged mask, causally, and at one query; and it reads K/V without copying them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specroll.rollout.models import attention as attention_module
from specroll.rollout.models.attention import attention


def reference(q, k, v, mask, groups, causal=False, scale=None):
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("q_len", [1, 5])
def test_folded_gqa_equals_repeated_kv_under_a_ragged_mask(groups, q_len):
    gen = torch.Generator().manual_seed(groups * 10 + q_len)
    n, kv_heads, k_len, dim = 3, 2, 11, 8
    q = torch.randn(n, kv_heads * groups, q_len, dim, generator=gen)
    k, v = (torch.randn(n, kv_heads, k_len, dim, generator=gen) for _ in range(2))
    lengths = torch.tensor([11, 7, 5])  # row b sees its first lengths[b] - Q + q + 1 keys at query q
    slots = torch.arange(k_len)[None, None, :]
    positions = (lengths[:, None] - q_len + torch.arange(q_len)[None])[:, :, None]
    mask = (slots <= positions)[:, None]  # [n, 1, Q, K]
    got = attention(q, k, v, mask, groups, scale=0.3)
    torch.testing.assert_close(got, reference(q, k, v, mask, groups, scale=0.3), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("groups", [1, 3])
def test_causal_without_a_mask_is_torchs_is_causal(groups):
    gen = torch.Generator().manual_seed(groups)
    q = torch.randn(2, 2 * groups, 6, 4, generator=gen)
    k, v = (torch.randn(2, 2, 6, 4, generator=gen) for _ in range(2))
    torch.testing.assert_close(attention(q, k, v, None, groups, causal=True),
                               reference(q, k, v, None, groups, causal=True), rtol=1e-5, atol=1e-6)


def test_keys_and_values_are_not_repeated(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("K/V repeated along heads")

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", refuse)
    q, k = torch.randn(1, 8, 5, 4), torch.randn(1, 2, 9, 4)
    assert attention(q, k, k, torch.ones(1, 1, 5, 9, dtype=torch.bool), 4).shape == (1, 8, 5, 4)


def test_on_cuda_the_allowed_kernels_leave_cudnn_out():
    assert torch.nn.attention.SDPBackend.CUDNN_ATTENTION not in attention_module.CUDA_SDPA_BACKENDS
    assert attention_module.CUDA_SDPA_BACKENDS[-1] == torch.nn.attention.SDPBackend.MATH  # any call has a kernel
