"""The one tiny-model factory of the tests: causal LMs built from configs in seconds, no downloads.

`build_lm(arch, attn, vocab=, hidden=, layers=, seed=, logit_scale=, **config)` builds a fresh fp32
Llama / Qwen2 / Qwen3 in eval mode from `seed`; `config` overrides any field of the model's config
(`num_key_value_heads`, `max_position_embeddings`, token ids, ...). `logit_scale` multiplies
`lm_head` (a large one peaks the logits, so greedy decoding has no near-ties; 1 keeps HF's init).
`tiny_lm` is the session-cached `build_lm` (its models are shared: never mutate one), `noisy_copy` a
partly agreeing drafter of one, `make_prompts` random prompts. The helper modules (`ray_helpers`,
`online_fixtures`, `trl_tiny`) name their presets on top of it. Test modules import from here, not from
conftest.py, which every pytest process loads (the xdist controller too) and so stays light.
"""

from __future__ import annotations

import copy
import functools

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


@functools.cache
def tiny_lm(arch: str = "llama", attn: str = "sdpa", **kwargs) -> PreTrainedModel:
    """Session-cached `build_lm`; do not mutate the returned model."""
    return build_lm(arch, attn, **kwargs)


@functools.cache
def noisy_copy(arch: str = "llama", attn: str = "sdpa", noise: float = 0.03, seed: int = 1) -> PreTrainedModel:
    """The target with Gaussian noise (`noise` × the weights' std) on `lm_head`: a partly agreeing drafter."""
    model = copy.deepcopy(tiny_lm(arch, attn))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = model.lm_head.weight
        w.add_(noise * w.std() * torch.randn(w.shape, generator=gen))
    return model


def make_prompts(count: int, min_len: int, max_len: int, vocab: int = VOCAB, seed: int = 0) -> list[list[int]]:
    """`count` random prompts with lengths cycling through [min_len, max_len]."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [min_len + i % (max_len - min_len + 1) for i in range(count)]
    return [torch.randint(vocab, (n,), generator=gen).tolist() for n in lengths]


# vLLM's CPU attention runs head sizes 32, 64, ...: the tiny Llamas the vLLM tests serve
VLLM_SHAPE = dict(vocab=64, hidden=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64, logit_scale=6)


def hf_greedy(model: PreTrainedModel, prompt: list[int], new_tokens: int) -> list[int]:
    """`model`'s greedy continuation of `prompt` by full forwards (no cache): the reference other engines match."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(new_tokens):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[0, len(prompt):].tolist()
