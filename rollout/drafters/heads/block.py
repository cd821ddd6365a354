"""BlockHead: a DFlash-style block drafter — decoder layers that denoise a block of mask tokens in one pass.

DFlash (Chen, Liang, Liu 2026, arXiv 2602.06036; z-lab/dflash `dflash/model.py`) drafts a block of
`block_size` k positions at once: the anchor (the row's last kept token, at position a) and k − 1 mask
positions a + 1 … a + k − 1. The block's queries attend bidirectionally over the whole block and causally to
the *context*: the target's states at every position before the anchor, taken from several target layers
(`target_layers`, the outputs of those decoder layers), fused once (`fuse`: `hidden_norm(fc([s_1 ‖ … ‖ s_m]))`)
and projected into every draft layer's keys and values with that layer's own `k_proj` / `v_proj`
(`context_kv`: no queries, no MLP — the context only injects K/V). The block's output at mask position a + j,
final-normed, through the target's LM head is q for the token at a + j (no shift: the mask is what is denoised),
so one forward gives k − 1 drafts' marginals. The anchor's own output is unused.

Module names follow z-lab's checkpoint tensors one to one (`layers.{i}.self_attn.{q,k,v,o}_proj`,
`layers.{i}.self_attn.{q,k}_norm`, `layers.{i}.mlp.{gate,up,down}_proj`, `layers.{i}.input_layernorm`,
`layers.{i}.post_attention_layernorm`, `fc`, `hidden_norm`, `norm`), so `integrations.formats.dflash` maps a
checkpoint by name. Departs from DFlash: the mask positions' input is a trained vector of the head's own
(`mask_embedding`, a checkpoint's starts as the target's embedding of its `mask_token_id`), plain RoPE only
(a checkpoint with `rope_scaling` is refused), no sliding window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...models.attention import attention
from ...models.lean import rotate_half
from .parts import attention_geometry, config_value, normed

# kv(layer, k, v) → (keys, values) the block attends over: the ragged cache's update, or context ‖ block in training.
LayerKV = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def default_layers(num_target_layers: int, count: int = 3) -> tuple[int, ...]:
    """`count` target layers spread as DFlash's `build_target_layer_ids` spreads them (from layer 1 to L − 3),
    clamped into [0, L − 2] (the output of layer L − 1 is past what verification captures) and deduplicated."""
    if num_target_layers < 2:
        raise ValueError(f"a block drafter needs a target of >= 2 layers (it reads layer outputs below the last), "
                         f"got {num_target_layers}")
    start, end = 1, num_target_layers - 3
    spread = [num_target_layers // 2] if count == 1 else [
        round(start + i * (end - start) / (count - 1)) for i in range(count)]
    return tuple(sorted({min(max(i, 0), num_target_layers - 2) for i in spread}))


class BlockAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, bias: bool):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        self.q_norm = nn.RMSNorm(head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(head_dim, eps=eps)

    def keys_values(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs [n, Q, H] → roped keys and values [n, Hkv, Q, D]."""
        n, q_len, _ = h.shape
        k = normed(self.k_norm, self.k_proj(h).view(n, q_len, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(h).view(n, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return k * cos + rotate_half(k) * sin, v


class BlockMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class BlockLayer(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate_size: int,
                 eps: float, bias: bool):
        super().__init__()
        self.self_attn = BlockAttention(hidden_size, num_heads, num_kv_heads, head_dim, eps, bias)
        self.mlp = BlockMLP(hidden_size, intermediate_size)
        self.input_layernorm = nn.RMSNorm(hidden_size, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(hidden_size, eps=eps)


class BlockHead(nn.Module):
    def __init__(self, hidden_size: int, target_layers: Sequence[int], num_layers: int, num_heads: int,
                 num_kv_heads: int, head_dim: int, intermediate_size: int, block_size: int = 8,
                 rope_theta: float = 10000.0, eps: float = 1e-6, attention_bias: bool = False):
        """`target_layers`: sorted distinct target layer ids whose *outputs* are fused (DFlash's
        `target_layer_ids`); `block_size` k: the anchor and k − 1 mask positions (k − 1 drafts per forward)."""
        super().__init__()
        layers = [int(i) for i in target_layers]
        if not layers or layers != sorted(set(layers)) or layers[0] < 0:
            raise ValueError(f"block layers {list(target_layers)} are invalid: distinct sorted layer ids >= 0")
        if not (isinstance(block_size, int) and not isinstance(block_size, bool) and block_size >= 2):
            raise ValueError(f"block_size={block_size!r} is invalid: an int >= 2 (the anchor and >= 1 mask)")
        if num_layers < 1 or num_heads % num_kv_heads:
            raise ValueError(f"block head num_layers={num_layers}, num_heads={num_heads}, num_kv_heads={num_kv_heads} "
                             "are invalid: >= 1 layer, num_heads a multiple of num_kv_heads")
        self.target_layers, self.block_size = tuple(layers), block_size
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.layers = nn.ModuleList([BlockLayer(hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
                                                eps, attention_bias) for _ in range(num_layers)])
        self.fc = nn.Linear(len(layers) * hidden_size, hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        self.mask_embedding = nn.Parameter(torch.randn(hidden_size) * 0.02)  # [H]
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def for_target(cls, config, layers: Sequence[int] | None = None, block_size: int = 8, num_layers: int = 1,
                   seed: int = 0, intermediate_size: int | None = None) -> BlockHead:
        """A fresh head shaped after the target's config (its attention geometry and MLP width); `layers` None:
        `default_layers`."""
        text = config.get_text_config()
        hidden = text.hidden_size
        heads, head_dim, kv_heads, theta = attention_geometry(text)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return cls(hidden, layers or default_layers(text.num_hidden_layers), num_layers, heads,
                       kv_heads if heads % kv_heads == 0 else heads, head_dim,
                       intermediate_size or config_value(text, "intermediate_size") or 4 * hidden, block_size,
                       float(theta), config_value(text, "rms_norm_eps") or 1e-6)

    @property
    def hidden_size(self) -> int:
        return self.fc.weight.shape[0]

    @property
    def capture_layers(self) -> tuple[int, ...]:
        """What verification must capture (`ModelRunner.capture_hidden`: the input of layer i, HF's
        `hidden_states[i]`): the output of layer l is the input of layer l + 1 (DFlash's `hidden_states[l + 1]`)."""
        return tuple(i + 1 for i in self.target_layers)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's captured states [..., m·H] → the context [..., H]."""
        return normed(self.hidden_norm, self.fc(features))

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [n, 1, Q, D] at `positions` [n, Q]."""
        angles = positions[..., None].float() * self.inv_freq  # [n, Q, D/2]
        angles = torch.cat([angles, angles], -1)[:, None]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values [n, Hkv, C, D] of the fused context [n, C, H] at `positions` [n, C]."""
        cos, sin = self.rotary(positions, context.dtype)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]

    def block_inputs(self, anchor_embeds: torch.Tensor) -> torch.Tensor:
        """Anchor embeddings [..., H] → the block's inputs [..., k, H]: the anchor, then k − 1 mask embeddings."""
        mask = self.mask_embedding.to(anchor_embeds.dtype).expand(*anchor_embeds.shape[:-1], self.block_size - 1, -1)
        return torch.cat([anchor_embeds[..., None, :], mask], -2)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv: LayerKV, mask: torch.Tensor) -> torch.Tensor:
        """Block inputs x [n, Q, H] at `positions` [n, Q] → final-normed outputs [n, Q, H] (row j's, through the LM
        head, is q for the token at position j). `kv(i, k, v)`: layer i's block keys / values [n, Hkv, Q, D] → what
        its queries attend over [n, Hkv, K, D] under `mask` [n, 1, Q, K] (bool)."""
        n, q_len, _ = x.shape
        cos, sin = self.rotary(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = normed(layer.input_layernorm, x)
            q = normed(attn.q_norm, attn.q_proj(h).view(n, q_len, attn.num_heads, attn.head_dim)).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin  # [n, Hq, Q, D]
            k, v = kv(i, *attn.keys_values(h, cos, sin))  # [n, Hkv, K, D]
            out = attention(q, k, v, mask, attn.num_heads // attn.num_kv_heads)  # [n, Hq, Q, D]
            x = x + attn.o_proj(out.transpose(1, 2).reshape(n, q_len, -1))
            x = x + layer.mlp(normed(layer.post_attention_layernorm, x))
        return normed(self.norm, x)
