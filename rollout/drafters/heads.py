"""The trainable heads that read the target's hidden states: `MedusaHeads` and `EagleHead`.

Both work in the target's final-normed feature space (`hidden`: `lm_head(h_t)` is the target's
logits for token t + 1) and share the target's LM head and token embedding, which they never train:
the heads' gradients touch their own weights only. One module each, used by its drafter in the engine
(`medusa.MedusaDrafter`, `eagle.EagleDrafter`) and trained over whole sequences by the online learner
(`specroll.online_drafter`), so both paths run the same math.

- `MedusaHeads` (Cai et al. 2024, arXiv 2401.10774): K residual blocks h + SiLU(W_k h + b_k) on the
  newest hidden state; block k's output through the LM head predicts the token k + 1 positions past the
  one h predicts. W_k starts at zero, so a fresh head k predicts what the target predicts next. Departs
  from Medusa-1: one shared (frozen) LM head instead of a vocabulary projection per head.
- `EagleHead` (Li et al. 2024, arXiv 2401.15077): one decoder layer over fc([embed(x_{t+1}) ‖ h_t]),
  whose output, final-normed, is the predicted feature h_{t+1} (fed back for the next draft) and, through
  the LM head, the draft distribution for x_{t+2}. Plain RoPE, GQA attention, SwiGLU MLP.

Their attention (`attend`: projections, RoPE, GQA, over the ragged cache or causally) is also the EAGLE-3 head's
(`eagle3_head.Eagle3Head`, which reads several target layers and lives in its own module).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..models.attention import attention
from ..models.lean import rotate_half

# kv(k, v) → (keys, values) to attend over: the ragged cache's update, or None for a causal pass.
KVWrite = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


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
        x = x + self.o_proj(attend(self, _normed(self.attn_norm, x), positions, kv, mask))
        h = _normed(self.mlp_norm, x)
        x = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return _normed(self.out_norm, x)


def attend(head: nn.Module, h: torch.Tensor, positions: torch.Tensor, kv: KVWrite | None,
           mask: torch.Tensor | None) -> torch.Tensor:
    """A head's self-attention over inputs h [n, Q, ·] at `positions` [n, Q] → [n, Q, Hq·D] (before `o_proj`):
    its q/k/v projections (and per-head q/k norms where it has them, Qwen3-style), plain RoPE from its
    `inv_freq`, GQA. With `kv` (the cache's write) attends over what it returns under `mask` [n, 1, Q, K]
    (bool, or `mask` alone without `kv`); with neither, over the Q inputs causally."""
    n, q_len, _ = h.shape
    q = head.q_proj(h).view(n, q_len, head.num_heads, head.head_dim)
    k = head.k_proj(h).view(n, q_len, head.num_kv_heads, head.head_dim)
    if getattr(head, "q_norm", None) is not None:
        q, k = _normed(head.q_norm, q), _normed(head.k_norm, k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # [n, Hq, Q, D], [n, Hkv, Q, D]
    v = head.v_proj(h).view(n, q_len, head.num_kv_heads, head.head_dim).transpose(1, 2)
    angles = positions[..., None].float() * head.inv_freq  # [n, Q, D/2]
    cos, sin = (torch.cat([angles, angles], -1)[:, None].to(q.dtype) for angles in (angles.cos(), angles.sin()))
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    if kv is not None:
        k, v = kv(k, v)  # [n, Hkv, K, D]
    causal = kv is None and mask is None
    attn = attention(q, k, v, mask, head.num_heads // head.num_kv_heads, causal=causal)  # [n, Hq, Q, D]
    return attn.transpose(1, 2).reshape(n, q_len, -1)


def _normed(norm: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """`norm(x)`, computed in fp32 and returned in x's dtype: under the learner's bf16 autocast x is bf16 and the
    norm's weight fp32, which the fused kernel refuses (and a norm is where bf16 loses the most); in fp32 it is
    `norm(x)` exactly."""
    return F.rms_norm(x.float(), norm.normalized_shape, norm.weight.float(), norm.eps).to(x.dtype)
