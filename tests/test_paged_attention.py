"""The CPU paged-attention kernel (`models.paged_attention`) against SDPA over the same K/V gathered dense.

Shapes cover both of its code paths: blocks of 16 slots with head dims that are multiples of 8 (8 keys per
vector step) and odd block sizes / head dims (the scalar loop); GQA groups; several queries per row under a
ragged causal mask and a random mask; fp32 to 1e-5, bf16 to bf16's rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specroll.rollout.models import paged_attention

pytestmark = pytest.mark.skipif(paged_attention.kernel() is None, reason="no C++ toolchain to build the kernel")


def case(n: int, kv_heads: int, groups: int, q_len: int, dim: int, block: int, kv_len: int, seed: int,
         dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    per_row = -(-kv_len // block)
    num_blocks = n * per_row + 3
    keys = torch.randn(kv_heads, num_blocks * block, dim, generator=gen).to(dtype)
    values = torch.randn(kv_heads, num_blocks * block, dim, generator=gen).to(dtype)
    table = torch.randperm(num_blocks, generator=gen)[: n * per_row].reshape(n, per_row)
    q = torch.randn(n, kv_heads * groups, q_len, dim, generator=gen).to(dtype)
    return q, keys, values, table


def reference(q, keys, values, table, mask, block, kv_len, groups):
    slots = (table[:, :, None] * block + torch.arange(block)).reshape(table.shape[0], -1)[:, :kv_len]  # [n, K]
    dense_k = keys[:, slots].transpose(0, 1).float().repeat_interleave(groups, 1)  # [n, Hq, K, D]
    dense_v = values[:, slots].transpose(0, 1).float().repeat_interleave(groups, 1)
    return F.scaled_dot_product_attention(q.float(), dense_k, dense_v, attn_mask=mask)


@pytest.mark.parametrize(("n", "kv_heads", "groups", "q_len", "dim", "block", "kv_len"), [
    (5, 4, 1, 1, 32, 16, 70),    # decode, vector path, a partial last block
    (3, 2, 4, 5, 64, 16, 40),    # verification with GQA
    (4, 3, 2, 3, 12, 5, 23),     # odd block and head dim: the scalar loop
    (2, 1, 1, 7, 8, 8, 8),       # one full block
])
def test_kernel_equals_sdpa_over_the_gathered_blocks(n, kv_heads, groups, q_len, dim, block, kv_len):
    q, keys, values, table = case(n, kv_heads, groups, q_len, dim, block, kv_len, seed=n + dim)
    start = torch.tensor([kv_len - q_len - 3 * i for i in range(n)]).clamp_min(0)  # ragged rows
    positions = start[:, None] + torch.arange(q_len)  # [n, Q]
    causal = (torch.arange(kv_len)[None, None, :] <= positions[:, :, None])[:, None]  # [n, 1, Q, K]
    noise = torch.rand(n, 1, q_len, kv_len, generator=torch.Generator().manual_seed(1)) > 0.4
    for mask in (causal, causal & (noise | (torch.arange(kv_len) == 0))):
        out = paged_attention.kernel().paged_attention(q, keys, values, table, mask, block, kv_len, dim ** -0.5)
        torch.testing.assert_close(out, reference(q, keys, values, table, mask, block, kv_len, groups),
                                   atol=1e-5, rtol=1e-5)


def test_kernel_in_bfloat16_and_a_broadcast_mask():
    q, keys, values, table = case(3, 2, 2, 2, 32, 16, 50, seed=7, dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 2, 50, dtype=torch.bool)
    out = paged_attention.kernel().paged_attention(q, keys, values, table, mask, 16, 50, 32 ** -0.5)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(q, keys, values, table, mask, 16, 50, 2), atol=2e-2, rtol=2e-2)


def test_usable_only_on_cpu_with_a_boolean_mask_and_the_kernel_on(monkeypatch):
    q = torch.zeros(1, 1, 1, 8)
    assert paged_attention.usable(q, torch.ones(1, 1, 1, 4, dtype=torch.bool))
    assert not paged_attention.usable(q, torch.zeros(1, 1, 1, 4))  # additive (eager models): the gather serves
    assert not paged_attention.usable(q, None)
    monkeypatch.setenv("SPECROLL_PAGED_KERNEL", "0")
    assert not paged_attention.usable(q, torch.ones(1, 1, 1, 4, dtype=torch.bool))


def test_shapes_that_do_not_match_are_refused():
    q, keys, values, table = case(2, 2, 1, 1, 16, 8, 20, seed=3)
    mask = torch.ones(2, 1, 1, 20, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="mask must cover"):
        paged_attention.kernel().paged_attention(q, keys, values, table, mask[..., :19], 8, 20, 0.25)
    with pytest.raises(RuntimeError, match="share a dtype"):
        paged_attention.kernel().paged_attention(q.double(), keys, values, table, mask, 8, 20, 0.25)


def test_stale_kernel_builds_are_pruned_and_the_loaded_one_kept(tmp_path):
    import os
    import time

    from specroll.rollout.models.paged_attention import STALE_DAYS, prune_stale

    loaded, recent, stale, other = (tmp_path / f"paged_attention_{k}" for k in ("aaa", "bbb", "ccc", "ddd"))
    for path in (loaded, recent, stale):
        path.mkdir()
        (path / "kernel.so").write_bytes(b"x")
    (tmp_path / "unrelated").mkdir()
    other.write_text("a file, not a build")
    old = time.time() - (STALE_DAYS + 1) * 86400
    for path in (loaded, stale, other, tmp_path / "unrelated"):
        os.utime(path, (old, old))
    assert prune_stale(tmp_path, loaded) == [stale]
    assert loaded.is_dir() and recent.is_dir() and other.is_file() and (tmp_path / "unrelated").is_dir()
    assert time.time() - loaded.stat().st_mtime < 60  # marked used: the next load elsewhere keeps it


def test_pruning_a_cache_it_cannot_write_leaves_it_alone(tmp_path, monkeypatch):
    import os

    from specroll.rollout.models import paged_attention

    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(os, "utime", refuse)
    (tmp_path / "paged_attention_aaa").mkdir()
    assert paged_attention.prune_stale(tmp_path, tmp_path / "paged_attention_aaa") == []
