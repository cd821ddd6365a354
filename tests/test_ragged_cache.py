"""Ragged KV cache: a batched forward with per-row lengths equals each row's forward alone.

Rows of different lengths are prefilled in one padded call, then decoded in lockstep with the same
number of new tokens per row (so every row writes at a different offset), then partly rolled back
by setting `lens` and fed different tokens. At each stage the logits must equal a cache-free forward
of that row alone over its current tokens, to 1e-5 in fp32.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_lm

from specroll.rollout.models.runner import ModelRunner

ATOL = 1e-5


def alone(model, tokens: list[int]) -> torch.Tensor:
    """Logits [L, V] of one row forwarded alone, without a cache."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def random_tokens(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randint(64, shape, generator=gen)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_ragged_forward_and_rollback_match_row_alone(arch, attn):
    model = build_lm(arch, attn, logit_scale=1.0)
    runner = ModelRunner(model, batch=4, length=32, dtype=torch.float32, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 1, 9]
    rows = [random_tokens(gen, n).tolist() for n in lengths]
    live = slice(0, len(rows))

    # Ragged prefill in one right-padded call: logits at each row's last token.
    padded = torch.zeros(len(rows), max(lengths), dtype=torch.long)
    for b, r in enumerate(rows):
        padded[b, : len(r)] = torch.tensor(r)
    last = runner.extend(live, padded, torch.tensor(lengths))  # [n, V]
    for b, r in enumerate(rows):
        torch.testing.assert_close(last[b], alone(model, r)[-1], atol=ATOL, rtol=0)
    assert runner.cache.lens[live].tolist() == lengths

    # Lockstep decode: 3 tokens per row, each row at its own offset.
    new = random_tokens(gen, len(rows), 3)
    logits = runner.feed(live, new)  # [n, 3, V]
    rows = [r + new[b].tolist() for b, r in enumerate(rows)]
    for b, r in enumerate(rows):
        torch.testing.assert_close(logits[b], alone(model, r)[-3:], atol=ATOL, rtol=0)

    # Roll back a different number of tokens per row by setting lens, then feed other tokens.
    keep_back = torch.tensor([2, 0, 3])
    runner.rollback(live, runner.cache.lens[live] - keep_back)
    rows = [r[: len(r) - int(k)] for r, k in zip(rows, keep_back)]
    new = random_tokens(gen, len(rows), 2)
    logits = runner.feed(live, new)
    rows = [r + new[b].tolist() for b, r in enumerate(rows)]
    for b, r in enumerate(rows):
        torch.testing.assert_close(logits[b], alone(model, r)[-2:], atol=ATOL, rtol=0)


def test_move_row_keeps_a_rows_logits():
    model = build_lm("qwen2", "sdpa", logit_scale=1.0)
    runner = ModelRunner(model, batch=3, length=16, dtype=torch.float32, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    tokens = random_tokens(gen, 3, 6)
    runner.extend(slice(0, 3), tokens, torch.tensor([6, 4, 5]))
    runner.cache.move_row(2, 0)  # row 2 now lives in slot 0; slot 2 is free
    nxt = random_tokens(gen, 1, 1)
    logits = runner.feed(slice(0, 1), nxt)[0, 0]
    expected = alone(model, [*tokens[2, :5].tolist(), int(nxt)])[-1]
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
