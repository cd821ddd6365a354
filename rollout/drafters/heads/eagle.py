"""EagleHead (Li et al. 2024, arXiv 2401.15077): the EAGLE draft head — one decoder layer over
fc([embed(x_{t+1}) ‖ h_t]), whose output, final-normed, is the predicted feature h_{t+1} (fed back for the next
draft) and, through the LM head, the draft distribution for x_{t+2}. Plain RoPE, GQA attention, SwiGLU MLP.

It works in the target's final-normed feature space (`hidden`: `lm_head(h_t)` is the target's logits for token
t + 1) and shares the target's LM head and token embedding, which it never trains: its gradients touch its own
weights only. Used by its drafter in the engine (`drafters.eagle.EagleDrafter`) and trained over whole sequences
by the online learner (`specroll.online_drafter`), so both paths run the same math. Its attention (`parts.attend`)
is also the EAGLE-3 head's (`eagle3.Eagle3Head`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .parts import KVWrite, attend, normed


class EagleHead(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate_size: int,
                 rope_theta: float = 10000.0, eps: float = 1e-6):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.fc = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.attn_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.mlp_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.out_norm = nn.RMSNorm(hidden_size, eps=eps)
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def for_target(cls, config, seed: int = 0, intermediate_size: int | None = None) -> EagleHead:
        """A fresh head shaped after the target's config (one of its layers, its attention geometry);
        `intermediate_size` overrides the MLP's width (None: the target's)."""
        text = config.get_text_config()
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        theta = getattr(text, "rope_theta", None) or (getattr(text, "rope_parameters", None) or {}).get(
            "rope_theta", 10000.0)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return cls(text.hidden_size, heads, getattr(text, "num_key_value_heads", heads), head_dim,
                       intermediate_size or text.intermediate_size, float(theta), getattr(text, "rms_norm_eps", 1e-6))

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                kv: KVWrite | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Predicted features [n, Q, H] (final-normed) from token embeddings and features [n, Q, H] at
        `positions` [n, Q]. With `kv` (the cache's write) attends over what it returns under `mask`
        [n, 1, Q, K] (bool); without, over the Q inputs causally (training)."""
        x = self.fc(torch.cat([embeds, hidden], dim=-1))  # [n, Q, H]
        x = x + self.o_proj(attend(self, normed(self.attn_norm, x), positions, kv, mask))
        h = normed(self.mlp_norm, x)
        x = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return normed(self.out_norm, x)
