"""How buffered entries become batches: the tensors both drafter families pad alike, and batches by length.

An entry of either family (`buffer.BufferEntry`: `lm.data.BufferedRollout`, `heads.data.FeatureSequence`)
is prompt + completion ids with the target's top-k p at each completion position. `pad_entries` pads what
they share: the ids, right-padded with 0 to the longest context, and p's top-k with a weight per completion
position, placed where the family's batch indexes them — completion position t of row i at column
`offsets[i] + t` (the drafter LM's batch counts completion positions: offset 0; a head's batch counts
sequence positions: offset the prompt length), 0 elsewhere. Each family's `collate` adds its own tensors
(the LM's logits index, a head's hidden states).

`length_batches` groups entries of similar length for scoring (`scorer.Scorer.score_entries`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .buffer import BufferEntry


@dataclass
class PaddedEntries:
    token_ids: torch.Tensor  # [B, L] int64, right-padded with 0
    topk_ids: torch.Tensor  # [B, N, k] int64
    topk_probs: torch.Tensor  # [B, N, k] fp32, 0 outside completions
    weights: torch.Tensor  # [B, N] fp32, 0 outside completions


def pad_entries(entries: list[BufferEntry], width: int, offsets: list[int],
                position_weights: list[torch.Tensor] | None = None) -> PaddedEntries:
    """Pad `entries` with N = `width` top-k columns; `position_weights[i]` [T_i] defaults to 1 at every position."""
    if not entries:
        raise ValueError("a batch needs at least one entry")
    size, k = len(entries), max(e.topk_ids.shape[1] for e in entries)
    token_ids = torch.zeros(size, max(e.token_ids.shape[0] for e in entries), dtype=torch.long)
    topk_ids = torch.zeros(size, width, k, dtype=torch.long)
    topk_probs = torch.zeros(size, width, k)
    weights = torch.zeros(size, width)
    for i, (e, start) in enumerate(zip(entries, offsets)):
        end, ek = start + e.num_positions, e.topk_ids.shape[1]
        token_ids[i, : e.token_ids.shape[0]] = e.token_ids
        topk_ids[i, start:end, :ek] = e.topk_ids
        topk_probs[i, start:end, :ek] = e.topk_probs
        weights[i, start:end] = 1.0 if position_weights is None else position_weights[i]
    return PaddedEntries(token_ids, topk_ids, topk_probs, weights)


def length_batches(lengths: list[int], max_rows: int, slack: float = 1.25) -> list[list[int]]:
    """Indices of `lengths` in batches of similar length for scoring: ascending, at most `max_rows` a batch,
    and a batch closes before the next entry would pad it past `slack` × its real tokens (a batch is padded
    to its longest context; on the demo one batch of 64 held-out rollouts padded to its longest cost 2.4×
    batches of 16, measured)."""
    batches: list[list[int]] = []
    rows: list[int] = []
    tokens = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if rows and (len(rows) == max_rows or (len(rows) + 1) * lengths[i] > slack * (tokens + lengths[i])):
            batches.append(rows)
            rows, tokens = [], 0
        rows.append(i)
        tokens += lengths[i]
    return [*batches, rows] if rows else batches
