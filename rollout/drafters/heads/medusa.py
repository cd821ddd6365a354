"""MedusaHeads (Cai et al. 2024, arXiv 2401.10774): K residual blocks h + SiLU(W_k h + b_k) on the newest hidden
state; block k's output through the LM head predicts the token k + 1 positions past the one h predicts. W_k starts
at zero, so a fresh head k predicts what the target predicts next. Departs from Medusa-1: one shared (frozen) LM
head instead of a vocabulary projection per head.

Like the EAGLE head it works in the target's final-normed feature space and shares the target's LM head, which it
never trains; used by `drafters.medusa.MedusaDrafter` and trained by the online learner on the same math.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MedusaHeads(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"medusa_heads={num_heads} is invalid: an int >= 1")
        self.weight = nn.Parameter(torch.zeros(num_heads, hidden_size, hidden_size))  # [K, H_out, H_in]
        self.bias = nn.Parameter(torch.zeros(num_heads, hidden_size))  # [K, H]

    @property
    def num_heads(self) -> int:
        return self.weight.shape[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Features [..., K, H] of the K heads from hidden states [..., H]."""
        projected = torch.einsum("koi,...i->...ko", self.weight, hidden) + self.bias  # [..., K, H]
        return hidden[..., None, :] + F.silu(projected)
