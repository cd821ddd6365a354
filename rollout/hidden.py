"""Hidden states from verification: what the feature drafters (EAGLE-style, Medusa) read, at no extra forward.

The target's verification forward already computes its last hidden state at every fed position; a
drafter with `wants_hidden` gets them written into `RowBuffers.hidden` [B, L, H] (final-normed: what
the LM head reads, so `lm_head(hidden[b, t])` is the target's logits for token t + 1). The prefill
writes the prompt's positions, every step the γ + 1 it feeds (`ModelRunner.forward(hidden=...)`), plain
steps included. An engine whose drafter does not ask allocates nothing and writes nothing.

Consistency with the kept tokens needs no bookkeeping: the target cache always holds every token of a
row but the last, so position t < seq_len - 1 holds the hidden state of a fed *kept* token. A rejected
draft's state sits at or past seq_len - 1 and is overwritten by the next verification before any
drafter may read it; the state at seq_len - 1 (the last token, not yet fed) is never valid. Row moves
and new requests follow `RowBuffers.move_row` / `load` like every other per-slot buffer.

Memory: B × L × H × dtype bytes (the demo target, H = 512: 64 × 1034 × 512 × 4 B ≈ 135 MB; a 7B target
at bf16, 64 rows of 4k tokens ≈ 2 GB). Only EAGLE reads past the last position (its catch-up after rows it did
not draft for); a ring of γ + 1 positions per row would do for Medusa alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .batch import RowBuffers
from .cost_model import ForwardTimes


def last_hidden(rows: RowBuffers, live: slice | torch.Tensor) -> torch.Tensor:
    """[n, H] each live row's newest valid hidden state (position seq_len - 2: it predicted the row's
    last token). A one-token prompt has none before its first step: zeros, a useless but harmless draft."""
    position = (rows.seq_len[live] - 2).clamp_min(0)  # [n]
    hidden = rows.hidden[live]  # [n, L, H]
    return hidden.gather(1, position[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]


def time_draft_calls(draft: Callable[[int, int], object], batch_sizes: list[int], deadline: float,
                     device: torch.device, repeats: int = 5) -> ForwardTimes:
    """`Drafter.time_drafts` for a drafter whose draft at batch b and query length Q is `draft(b, Q)`:
    the fastest of `repeats` calls per point (the first warms up); unmeasured batch sizes past the
    deadline are extrapolated linearly from the last two measured."""
    times: list[list[float]] = []
    for batch in batch_sizes:
        row = []
        for query_len in (1, 2):
            samples = []
            for _ in range(repeats + 1):
                started = time.perf_counter()
                draft(batch, query_len)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                samples.append(time.perf_counter() - started)
            row.append(max(min(samples[1:]), 1e-7))
        times.append([row[0], max(row)])
        if time.perf_counter() > deadline and len(times) >= 2:
            break
    while len(times) < len(batch_sizes):
        (b0, t0), (b1, t1) = zip(batch_sizes[len(times) - 2 : len(times)], times[-2:])
        b = batch_sizes[len(times)]
        times.append([y1 + (y1 - y0) * (b - b1) / max(b1 - b0, 1) for y0, y1 in zip(t0, t1)])
    return ForwardTimes(list(batch_sizes), [1, 2], times)
