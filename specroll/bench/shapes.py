"""Model shapes the benchmarks build from configs (random init, no downloads), and the builder.

`target` is Qwen2.5-0.5B's shape (896 wide, 24 layers, 14 query / 2 K/V heads, MLP 4864, V = 151,936);
the drafters are small LMs over the same vocabulary. `gpu_check` and the real-shape workload of `specroll
bench` (`real_shape`) both build from this table.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM


class Shape(NamedTuple):
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


SHAPES = {
    "target": Shape(896, 24, 14, 2, 4864, 151936),  # Qwen2.5-0.5B
    "drafter": Shape(256, 4, 4, 2, 1024, 151936),
    "drafter_2x384": Shape(384, 2, 6, 2, 1024, 151936),
    "tiny_target": Shape(64, 2, 4, 2, 128, 512),
    "tiny_drafter": Shape(32, 1, 4, 2, 64, 512),
}


def params_m(model: torch.nn.Module) -> float:
    """Parameters in millions (a tied head counted once)."""
    return sum(p.numel() for p in model.parameters()) / 1e6


def build(kind: str | Shape, seed: int, tied: bool = False) -> PreTrainedModel:
    """A random-init Qwen2 LM of `SHAPES[kind]` (or the given `Shape`), in eval mode. `tied`: the LM head is the
    token embedding, as in Qwen2.5-0.5B. Untied by default: a random model with tied embeddings predicts its
    own last input token, and any two such models agree on every greedy token (`gpu_check` compares drafters
    by agreement; for timing it does not matter)."""
    hidden, layers, heads, kv, inter, vocab = SHAPES[kind] if isinstance(kind, str) else kind
    torch.manual_seed(seed)
    config = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                         max_position_embeddings=4096, attn_implementation="sdpa", tie_word_embeddings=tied)
    return Qwen2ForCausalLM(config).eval()
