"""Logits → the processed distribution every token is drawn from: temperature, then top-k, then top-p.

Used for the target's p at every verified position and for each drafter's q, so both are processed alike
(`SamplingParams`); greedy decoding is the T → 0 limit, a one-hot distribution at the argmax.
"""

from __future__ import annotations

import torch

from ..config import SamplingParams


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Processed probabilities (temperature, then top-k, then top-p), shape of `logits`, fp32.

    For greedy params this returns the one-hot distribution at the argmax (the T → 0 limit). Where
    the logits hold a NaN or +inf, or are all -inf, there is no distribution: that row comes out NaN
    in both modes (softmax gives it; greedy marks it), which is how callers detect it. Lower-precision logits
    are upcast here, once; at T = 1 with neither top-k nor top-p the only [.., V] tensor made is the result.
    """
    logits = logits.float()
    if params.greedy:
        best = logits.max(-1, keepdim=True)  # max propagates NaN: its value is finite iff the row is usable
        one_hot = torch.zeros_like(logits).scatter_(-1, best.indices, 1.0)
        return one_hot.masked_fill_(~best.values.isfinite(), float("nan"))
    if params.temperature != 1.0:  # at T = 1 no [.., V] copy
        logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass *before* it
        # already reaches top_p. The first token is always kept.
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)

