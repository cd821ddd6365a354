"""The one tiny-model factory of the tests: causal LMs built from configs in seconds, no downloads.

`build_lm(arch, attn, vocab=, hidden=, layers=, seed=, logit_scale=, **config)` builds a fresh fp32
Llama / Qwen2 / Qwen3 in eval mode from `seed`; `config` overrides any field of the model's config
(`num_key_value_heads`, `max_position_embeddings`, token ids, ...). `logit_scale` multiplies
`lm_head` (a large one peaks the logits, so greedy decoding has no near-ties; 1 keeps HF's init).
The helper modules (`conftest`, `ray_fixtures`, `online_fixtures`, `trl_tiny`) name their presets
on top of it.
"""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}
VOCAB = 64


def build_lm(arch: str = "llama", attn: str = "sdpa", *, vocab: int = VOCAB, hidden: int = 32, layers: int = 2,
             seed: int = 0, logit_scale: float = 30.0, **config) -> PreTrainedModel:
    """A fresh tiny fp32 model in eval mode (see the module docstring)."""
    config_cls, model_cls = ARCHS[arch]
    fields = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=256,
                  tie_word_embeddings=False, attn_implementation=attn)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**fields, **config})).float().eval()
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model
