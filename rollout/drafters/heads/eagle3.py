"""Eagle3Head: the EAGLE-3 draft head — one decoder layer over fused low / middle / high target features.

EAGLE-3 (Li et al. 2025, arXiv 2503.01840) reads the target's residual stream entering k of its decoder layers
(`target_layers`, by default low / middle / high: `default_layers`) where EAGLE-1 read the last hidden state,
fuses them with `fc` ([a_1 ‖ … ‖ a_k], k·H → H), and runs one decoder layer whose attention reads
[norm(embed(x_{t+1})) ‖ norm(h_t)] (2H wide) with h_t as the residual. Its output o_t, final-normed (`final`),
through an LM head is q for token t + 2; o_t itself is the hidden input of the next draft (the "training-time
test" trains the head on these states of its own: `online_drafter.heads.objectives`). The LM head is the
target's, or its own over a draft vocabulary (`draft_ids`, the target ids of its rows: the public checkpoints'
`d2t`, `drafters.draft_vocab`).

The module's names follow the public EAGLE-3 layer (vllm-project/speculators' `layers.0.*`, SpecForge's
`midlayer.*`) one to one, so `integrations.formats.eagle3` maps a checkpoint's tensors by name alone:
`input_norm` is their `input_layernorm` (the embeddings' norm), `mlp_norm` their `post_attention_layernorm`.
Departs from them: plain RoPE only (a checkpoint with `rope_scaling` is refused), one decoder layer, and the
token embedding is always the target's (a checkpoint's copy is checked against it and dropped).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .parts import KVWrite, attend, attention_geometry, config_value, normed

FUSION_NORMS = (None, "joint", "per_layer")  # `Eagle3Head.fusion_norm`


def default_layers(num_layers: int) -> tuple[int, ...]:
    """Low / middle / high for a target of `num_layers` layers: (2, L // 2, L - 3), clamped into [0, L - 1] and
    deduplicated (a 2-layer test model gets (0, 1))."""
    low, mid, high = 2, num_layers // 2, num_layers - 3
    return tuple(sorted({min(max(i, 0), num_layers - 1) for i in (low, mid, high)}))


class Eagle3Head(nn.Module):
    def __init__(self, hidden_size: int, target_layers: Sequence[int], num_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate_size: int, rope_theta: float = 10000.0, eps: float = 1e-6,
                 draft_ids: torch.Tensor | None = None, ttt_steps: int = 3, qk_norm: bool = False,
                 attention_bias: bool = False, norm_before_residual: bool = False, fusion_norm: str | None = None,
                 norm_output: bool = False):
        """`target_layers`: sorted distinct target layer ids whose input states are fused; `draft_ids` [N] sorted
        target ids of an own LM head's rows (None: drafts through the target's LM head); `ttt_steps`: the draft
        depths the online learner trains and scores the head at (its training-time test). The public options:
        `fusion_norm` "joint" (one RMSNorm over the k·H states before `fc`: speculators' `norm_before_fc`) or
        "per_layer" (one per layer's H: `fc_norm`); `norm_output` (EAGLE 3.1: the next draft is fed the normed
        output); `norm_before_residual` (the residual is the normed hidden input)."""
        super().__init__()
        layers = [int(i) for i in target_layers]
        if not layers or layers != sorted(set(layers)) or layers[0] < 0:
            raise ValueError(f"eagle3 layers {list(target_layers)} are invalid: distinct sorted layer ids >= 0")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        if not (isinstance(ttt_steps, int) and ttt_steps >= 1):
            raise ValueError(f"eagle3 ttt_steps={ttt_steps!r} is invalid: an int >= 1")
        if fusion_norm not in FUSION_NORMS:
            raise ValueError(f"eagle3 fusion_norm={fusion_norm!r} is invalid: one of {FUSION_NORMS}")
        self.target_layers = tuple(layers)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.ttt_steps, self.norm_before_residual, self.norm_output = ttt_steps, norm_before_residual, norm_output
        self.fc_input_norm = nn.RMSNorm(len(layers) * hidden_size, eps=eps) if fusion_norm == "joint" else None
        self.fc_norms = nn.ModuleList([nn.RMSNorm(hidden_size, eps=eps) for _ in layers]) \
            if fusion_norm == "per_layer" else None
        self.fc = nn.Linear(len(layers) * hidden_size, hidden_size, bias=False)
        self.input_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.hidden_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.q_proj = nn.Linear(2 * hidden_size, num_heads * head_dim, bias=attention_bias)
        self.k_proj = nn.Linear(2 * hidden_size, num_kv_heads * head_dim, bias=attention_bias)
        self.v_proj = nn.Linear(2 * hidden_size, num_kv_heads * head_dim, bias=attention_bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=attention_bias)
        self.q_norm = nn.RMSNorm(head_dim, eps=eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(head_dim, eps=eps) if qk_norm else None
        self.mlp_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        if draft_ids is not None:
            draft_ids = torch.as_tensor(draft_ids, dtype=torch.long)
            if draft_ids.dim() != 1 or not bool((draft_ids[1:] > draft_ids[:-1]).all()):
                raise ValueError("eagle3 draft_ids must be a 1-D tensor of increasing target ids")
        self.lm_head = None if draft_ids is None else nn.Linear(hidden_size, draft_ids.numel(), bias=False)
        # int64 [N] or None. Not in the state dict: a drafter version is its parameters (+ a draft vocabulary), as
        # every weight sync and digest counts it; the ids come with the head's construction (its checkpoint).
        self.register_buffer("draft_ids", draft_ids, persistent=False)
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def for_target(cls, config, layers: Sequence[int] | None = None, seed: int = 0,
                   intermediate_size: int | None = None, draft_ids: torch.Tensor | None = None,
                   ttt_steps: int = 3) -> Eagle3Head:
        """A fresh head shaped after the target's config (one of its layers' geometry); `layers` None: the
        low / middle / high default; `intermediate_size` None: the target's MLP width."""
        text = config.get_text_config()
        hidden = text.hidden_size
        heads, head_dim, kv_heads, theta = attention_geometry(text)  # the head's attention is its own
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return cls(hidden, layers or default_layers(text.num_hidden_layers), heads,
                       kv_heads if heads % kv_heads == 0 else heads, head_dim,
                       intermediate_size or config_value(text, "intermediate_size") or 4 * hidden,
                       float(theta), config_value(text, "rms_norm_eps") or 1e-6, draft_ids, ttt_steps)

    @property
    def hidden_size(self) -> int:
        return self.fc.weight.shape[0]

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's captured states [..., k·H] (`models.runner.ModelRunner.capture_hidden`) → [..., H]."""
        if self.fc_input_norm is not None:
            features = normed(self.fc_input_norm, features)
        elif self.fc_norms is not None:
            chunks = features.chunk(len(self.fc_norms), dim=-1)  # [..., H] each
            features = torch.cat([normed(norm, chunk) for norm, chunk in zip(self.fc_norms, chunks)], dim=-1)
        return self.fc(features)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                kv: KVWrite | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output o [n, Q, H] (the next draft's `hidden`: before the final norm, after it with
        `norm_output`) from token embeddings
        and hidden inputs [n, Q, H] (fused features, or the head's own earlier outputs) at `positions` [n, Q].
        `kv`, `mask`: as `heads.attend` (the ragged cache's write and its mask; neither: causal over the Q)."""
        residual = hidden
        hidden = normed(self.hidden_norm, hidden)
        if self.norm_before_residual:
            residual = hidden
        x = torch.cat([normed(self.input_norm, embeds), hidden], dim=-1)  # [n, Q, 2H]
        x = residual + self.o_proj(attend(self, x, positions, kv, mask))
        h = normed(self.mlp_norm, x)
        out = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return normed(self.norm, out) if self.norm_output else out

    def final(self, out: torch.Tensor) -> torch.Tensor:
        """What the LM head reads: the final-normed output (normed already with `norm_output`)."""
        return out if self.norm_output else normed(self.norm, out)
