"""Writers of EAGLE-3 checkpoints in the two public layouts, for the loader's tests (`integrations.formats.eagle3`).

They follow the public files, not this project's loader: vllm-project/speculators at c05b95b
(`src/speculators/models/eagle3/config.py` for config.json's fields, `core.py` and `model_definitions.py` for
the module names `layers.0.*`, `src/speculators/model.py` for `d2t` / `t2d`, `train/vocab_mapping.py` for
d2t = target id − draft index and t2d a bool mask), and SpecForge at a6b6b02 (`configs/*-eagle3.json`, a
LlamaConfig with `draft_vocab_size` and `eagle_config.eagle_aux_hidden_state_layer_ids`;
`specforge/modeling/draft/llama3_eagle.py` for `midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`) with SGLang's
layer numbering (`set_eagle3_layers_to_capture`: a configured id j captures the input of layer j + 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, Qwen3Config

from specroll.rollout.drafters.eagle3_head import Eagle3Head

OURS_TO_PUBLIC = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
                  "o_proj": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
                  "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj",
                  "input_norm": "input_layernorm", "hidden_norm": "hidden_norm", "mlp_norm": "post_attention_layernorm"}
# speculators' `input_norm` (norm_before_fc, over the k·H states) and both layouts' `fc_norm.{i}` (one per layer)
FUSION_TO_PUBLIC = {"fc_input_norm": "input_norm", "fc_norms": "fc_norm"}


def layer_config(head: Eagle3Head, target, model_type: str = "llama", **overrides):
    """The draft layer's transformers config as the checkpoints store it (the target's vocabulary and token ids)."""
    text = target.config
    fields = dict(hidden_size=head.hidden_size, intermediate_size=head.gate_proj.weight.shape[0], num_hidden_layers=1,
                  num_attention_heads=head.num_heads, num_key_value_heads=head.num_kv_heads, head_dim=head.head_dim,
                  vocab_size=target.get_output_embeddings().weight.shape[0], rms_norm_eps=head.norm.eps,
                  max_position_embeddings=text.max_position_embeddings, bos_token_id=text.bos_token_id,
                  eos_token_id=text.eos_token_id, tie_word_embeddings=False)
    return (Qwen3Config if model_type == "qwen3" else LlamaConfig)(**{**fields, **overrides})


def _tensors(head: Eagle3Head, target, prefix: str) -> dict[str, torch.Tensor]:
    out = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().clone()}
    for name, tensor in head.state_dict().items():
        module, _, kind = name.rpartition(".")
        if module in OURS_TO_PUBLIC:
            name = f"{prefix}{OURS_TO_PUBLIC[module]}.{kind}"
        elif name.split(".")[0] in FUSION_TO_PUBLIC:  # the fusion's norms sit at the top level
            first, _, rest = name.partition(".")
            name = f"{FUSION_TO_PUBLIC[first]}.{rest}"
        out[name] = tensor.detach().clone()
    ids = head.draft_ids
    vocab = target.get_output_embeddings().weight.shape[0]
    if ids is not None and ids.numel() < vocab:
        out["d2t"] = ids - torch.arange(ids.numel())
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids] = True
        out["t2d"] = t2d
    return out


def write_speculators(head: Eagle3Head, target, folder: Path, model_type: str = "llama", layer_ids=None,
                      **config_overrides) -> Path:
    """`head` saved as speculators' `Eagle3DraftModel.save_pretrained` lays it out (config.json + model.safetensors).
    `layer_ids`: eagle_aux_hidden_state_layer_ids (default: the head's own; vLLM's numbering is ours)."""
    folder.mkdir(parents=True, exist_ok=True)
    layer = layer_config(head, target, model_type)
    vocab = target.get_output_embeddings().weight.shape[0]
    config = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
        "transformer_layer_config": layer.to_diff_dict(),
        "draft_vocab_size": vocab if head.draft_ids is None else head.draft_ids.numel(),
        "norm_before_residual": head.norm_before_residual, "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(head.target_layers if layer_ids is None else layer_ids),
        "norm_before_fc": head.fc_input_norm is not None, "fc_norm": head.fc_norms is not None,
        "norm_output": head.norm_output, "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": head.ttt_steps,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": "tests/tiny-target", "architectures": list(target.config.architectures or [])},
        },
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps({**config, **config_overrides}, indent=2))
    save_file(_tensors(head, target, "layers.0."), folder / "model.safetensors")
    return folder


def write_specforge(head: Eagle3Head, target, folder: Path, layer_ids=None, **config_overrides) -> Path:
    """`head` saved as SpecForge's `LlamaForCausalLMEagle3` lays it out; `layer_ids` in SGLang's numbering (default:
    the head's own layers, each minus one)."""
    folder.mkdir(parents=True, exist_ok=True)
    layer = layer_config(head, target).to_dict()
    vocab = target.get_output_embeddings().weight.shape[0]
    ids = [i - 1 for i in head.target_layers] if layer_ids is None else list(layer_ids)
    config = {**{k: v for k, v in layer.items() if k not in ("transformers_version", "dtype")},
              "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "draft_vocab_size": vocab if head.draft_ids is None else head.draft_ids.numel(),
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
              **({"fc_norm": True} if head.fc_norms is not None else {}),
              "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps({**config, **config_overrides}, indent=2))
    save_file(_tensors(head, target, "midlayer."), folder / "model.safetensors")
    return folder
