"""Hidden states from verification: what the feature drafters (EAGLE-style, Medusa) read, at no extra forward.

The target's verification forward already computes its last hidden state at every fed position; a
drafter with `wants_hidden` gets them written into `RowBuffers.hidden` [B, L, H] (final-normed: what
the LM head reads, so `lm_head(hidden[b, t])` is the target's logits for token t + 1). The prefill
writes the prompt's positions, every step the γ + 1 it feeds (`ModelRunner.forward(hidden=...)`), plain
steps included. An engine whose drafter does not ask allocates nothing and writes nothing. An EAGLE-3 drafter
asks for other states: the residual stream entering its chosen target layers, concatenated ([B, L, k·H],
`ModelRunner.capture_hidden`); everything below holds for them alike.

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

import torch

from ..core.batch import RowBuffers
from ..models.rows import Rows, device_index


def last_hidden(rows: RowBuffers, live: Rows) -> torch.Tensor:
    """[n, H] each live row's newest valid hidden state (position seq_len - 2: it predicted the row's
    last token). A one-token prompt has none before its first step: zeros, a useless but harmless draft."""
    live = device_index(live)
    position = (rows.seq_len[live] - 2).clamp_min(0)  # [n]
    hidden = rows.hidden[live]  # [n, L, H]
    return hidden.gather(1, position[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]
