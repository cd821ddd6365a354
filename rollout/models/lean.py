"""A lean forward pass for Llama-family decoders (Llama, Mistral, Qwen2, Qwen3) over the ragged cache.

At rollout batch sizes a decode step of a small model is mostly Python: HF's module tree, keyword
plumbing and per-layer mask and cache bookkeeping cost about as much as the matrix products on a
CPU, and a drafter's step is nearly all overhead. `LeanDecoder` runs the same math on the same
weights with the fewest kernel calls: one fused q/k/v product and one fused gate/up product per
layer, RMSNorm and rotary inline, the HF rotary module for cos/sin (so every `rope_scaling` type
is honoured), SDPA with the runner's 4D mask, and the LM head only where logits are needed.

The fused weights are the storage of the HF parameters: after fusing, `q_proj.weight` & co. are
views into the fused tensor (on CPU stored input-major, see `_fuse`), so in-place weight updates
(`copy_into`, `load_state_dict`) reach both. If something rebinds the parameters (e.g. a later
`model.to(...)`), the views are rebuilt on the next forward. Models it does not cover (other
architectures, eager attention, sliding windows, non-SiLU MLPs) run through HF's own forward;
`unsupported_reason` says why.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from .cache import RaggedKVCache

LEAN_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def lean_decoder(model: PreTrainedModel) -> LeanDecoder | None:
    """The model's `LeanDecoder` (one per model, shared by every engine that runs it), or None if unsupported."""
    if unsupported_reason(model) is not None:
        return None
    decoder = getattr(model, "_specroll_lean", None)
    if decoder is None:
        decoder = LeanDecoder(model)
        model._specroll_lean = decoder
    return decoder


@torch.no_grad()
def unfuse(model: PreTrainedModel) -> PreTrainedModel:
    """Give `model` back independent, contiguous weights (e.g. before `save_pretrained`, which refuses
    parameters that share storage); an engine still holding it re-fuses on its next forward."""
    decoder = getattr(model, "_specroll_lean", None)
    if decoder is not None:
        for layer in decoder.layers:
            for lin in layer.linears:
                lin.weight.data = lin.weight.data.clone(memory_format=torch.contiguous_format)
                if lin.bias is not None:
                    lin.bias.data = lin.bias.data.clone()
        head = decoder.lm_head.weight  # K-major on CPU (`_k_major_head`); a tied embedding is the same parameter
        head.data = head.data.clone(memory_format=torch.contiguous_format)
        del model._specroll_lean
    return model


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """None if `LeanDecoder` computes exactly what `model` does, else why not."""
    config = model.config
    if config.model_type not in LEAN_MODEL_TYPES:
        return f"model_type {config.model_type!r} (lean forward covers {', '.join(LEAN_MODEL_TYPES)})"
    if config._attn_implementation != "sdpa":
        return f"attn_implementation {config._attn_implementation!r} (lean forward uses sdpa)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if getattr(config, "mlp_bias", False):
        return "mlp_bias"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
        return "sliding-window attention layers"
    if config.model_type == "mistral" and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "layers") or not hasattr(body, "rotary_emb"):
        return "no model.layers / model.rotary_emb"
    return None


class _Layer:
    """One decoder layer's tensors; the HF params are views of these (fused, maybe K-major) weights."""

    def __init__(self, layer: torch.nn.Module, k_major: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.module = layer
        self.input_norm = layer.input_layernorm
        self.post_norm = layer.post_attention_layernorm
        self.q_norm = getattr(attn, "q_norm", None)  # Qwen3: RMSNorm over each head before rotary
        self.k_norm = getattr(attn, "k_norm", None)
        self.linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        self.qkv_weight = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], k_major)
        self.qkv_bias = _fuse_bias([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o_weight, self.o_bias = _fuse([attn.o_proj], k_major), attn.o_proj.bias
        self.gate_up_weight = _fuse([mlp.gate_proj, mlp.up_proj], k_major)
        self.down_weight = _fuse([mlp.down_proj], k_major)
        self.q_size = attn.q_proj.weight.shape[0]
        self.kv_size = attn.k_proj.weight.shape[0]
        self.inter = mlp.gate_proj.weight.shape[0]

    def is_fused(self) -> bool:
        q = self.module.self_attn.q_proj.weight
        return q.data_ptr() == self.qkv_weight.data_ptr() and q.device == self.qkv_weight.device


class LeanDecoder:
    """Forward of a supported HF decoder with the runner's ragged cache and 4D mask."""

    def __init__(self, model: PreTrainedModel):
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"LeanDecoder does not support this model: {reason}")
        self.model = model
        config = model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.scaling = self.head_dim**-0.5
        self._fuse()

    def _fuse(self) -> None:
        body = self.model.model
        self.embed = body.embed_tokens
        self.rotary = body.rotary_emb
        self.final_norm = body.norm
        self.lm_head = self.model.lm_head
        k_major = self.model.lm_head.weight.device.type == "cpu"
        self.layout = "fused-k-major" if k_major else "fused"  # part of the cost model's cache key
        self.layers = [_Layer(layer, k_major) for layer in body.layers]
        if k_major:
            _k_major_head(self.lm_head, self.embed)

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
                 cache: RaggedKVCache, logits_at: torch.Tensor | None = None, num_layers: int | None = None,
                 hidden_out: Callable[[torch.Tensor], None] | None = None,
                 head: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 capture: tuple[int, ...] | None = None) -> torch.Tensor:
        """Logits [n, Q, V], or [n, V] at query index `logits_at` [n] of each row when given.

        `num_layers`: run only the first that many decoder layers, then the final norm and LM head (a
        layer-skip draft). `hidden_out`, if given, is handed the final-normed hidden state at every query
        [n, Q, H] — what the LM head reads, and what feature drafters read (`drafters.hidden`). `head` replaces
        the LM head (a draft vocabulary's rows of it, `drafters.draft_vocab`). `capture` (sorted layer ids): hand
        `hidden_out` the residual stream entering each of those layers instead, concatenated [n, Q, k·H] (EAGLE-3)."""
        if not self.layers[0].is_fused():
            self._fuse()
        n, q_len = input_ids.shape
        hidden = self.embed(input_ids)  # [n, Q, H]
        cos, sin = self.rotary(hidden, position_ids)  # [n, Q, D]
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        groups = self.num_heads // self.num_kv_heads
        captured = []
        for index, layer in enumerate(self.layers[:num_layers]):
            if capture is not None and index in capture:
                captured.append(hidden)
            x = _rms_norm(hidden, layer.input_norm)
            qkv = F.linear(x, layer.qkv_weight, layer.qkv_bias)  # [n, Q, (Hq + 2 Hkv) D]
            q, k, v = qkv.split((layer.q_size, layer.kv_size, layer.kv_size), dim=-1)
            q = q.view(n, q_len, self.num_heads, self.head_dim)
            k = k.view(n, q_len, self.num_kv_heads, self.head_dim)
            if layer.q_norm is not None:
                q, k = _rms_norm(q, layer.q_norm), _rms_norm(k, layer.k_norm)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # [n, heads, Q, D]
            v = v.view(n, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            attn = cache.layers[index].attend(q, k, v, mask, groups, self.scaling)  # [n, Hq, Q, D]
            attn = attn.transpose(1, 2).reshape(n, q_len, self.num_heads * self.head_dim)  # [n, Q, Hq D]
            hidden = hidden + F.linear(attn, layer.o_weight, layer.o_bias)
            x = _rms_norm(hidden, layer.post_norm)
            gate, up = F.linear(x, layer.gate_up_weight).split((layer.inter, layer.inter), dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer.down_weight)
        if hidden_out is not None:
            hidden = _rms_norm(hidden, self.final_norm)  # [n, Q, H]
            hidden_out(hidden if capture is None else torch.cat(captured, -1))
        if logits_at is not None:
            hidden = hidden[torch.arange(n, device=hidden.device), logits_at][:, None]  # [n, 1, H]
        logits = (head or self.lm_head)(hidden if hidden_out is not None else _rms_norm(hidden, self.final_norm))
        return logits[:, 0] if logits_at is not None else logits


def _rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """HF's Llama/Qwen RMSNorm: normalised in fp32, cast back, then scaled."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x32.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotary embedding's pairing of the two halves of the last dim, (x1, x2) → (−x2, x1): also the EAGLE head's
    (`drafters.heads`)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@torch.no_grad()
def _fuse(linears: list[torch.nn.Linear], k_major: bool) -> torch.Tensor:
    """Concatenate the weights along the output axis and rebind each weight as a view of the result.

    `k_major` stores the result transposed ([in, out] contiguous; the returned [out, in] tensor is a
    view of it). On CPU a product with several rows (verification's γ + 1 tokens, a batch) runs
    1.4–2.4x faster against that layout, and a one-row product no slower (measured on this project's
    2-core machine, torch 2.13); GPUs keep HF's layout.
    """
    fused = torch.cat([lin.weight.data for lin in linears], dim=0)
    if k_major:
        fused = fused.t().contiguous().t()
    _rebind_rows(linears, fused, "weight")
    return fused


@torch.no_grad()
def _k_major_head(lm_head: torch.nn.Module, embed: torch.nn.Module) -> None:
    """Store the LM head's weight K-major on CPU, as `_fuse` does the layers' (at V = 151,936, H = 896 a product of
    2–5 rows ran 1.2–1.8x faster so, one row no slower); a tied embedding is rebound to the same parameter, so
    the two stay one tensor and a policy update writes both."""
    weight = lm_head.weight
    if not weight.is_contiguous():  # already K-major (or some other layout we leave alone)
        return
    k_major = torch.nn.Parameter(weight.data.t().contiguous().t(), requires_grad=weight.requires_grad)
    if embed.weight is weight:
        embed.weight = k_major
    lm_head.weight = k_major


@torch.no_grad()
def _fuse_bias(linears: list[torch.nn.Linear]) -> torch.Tensor | None:
    """The fused bias (zeros where a projection has none), rebinding existing biases as views; or None."""
    if all(lin.bias is None for lin in linears):
        return None
    like = next(lin.bias for lin in linears if lin.bias is not None)
    parts = [lin.bias.data if lin.bias is not None else like.new_zeros(lin.weight.shape[0]) for lin in linears]
    fused = torch.cat(parts)
    _rebind_rows(linears, fused, "bias")
    return fused


def _rebind_rows(linears: list[torch.nn.Linear], fused: torch.Tensor, name: str) -> None:
    """Make each linear's `name` parameter (where it has one) the view of its rows of `fused`."""
    offset = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        param = getattr(lin, name)
        if param is not None:
            param.data = fused[offset : offset + rows]
        offset += rows
