"""Public EAGLE-3 checkpoints as `Eagle3Head`s: the vllm-project/speculators layout and SpecForge's, read; and a
head written in the speculators layout (`save_eagle3_checkpoint`: what `specroll train` / `distill` / `export` keep).

    head = load_eagle3_checkpoint("path/to/checkpoint", target, target_tokenizer)   # refuses what does not fit
    engine = SpecEngine(target, head, EngineConfig(drafters=("eagle3",)))
    save_eagle3_checkpoint(head, target, "out/drafter", verifier="out/policy")

A checkpoint is a folder with `config.json` and `model.safetensors` (or shards listed in
`model.safetensors.index.json`). The two layouts (read from the public code; docs/drafters.md cites the files
and commits):

- **speculators** (`speculators_model_type: "eagle3"`, `Eagle3SpeculatorConfig`): the draft layer's config
  under `transformer_layer_config` (a diff dict of a `llama` / `qwen3` config), `draft_vocab_size`,
  `target_hidden_size`, `eagle_aux_hidden_state_layer_ids` (vLLM's numbering: the residual stream *entering*
  decoder layer i — ours), `norm_before_residual`, `norm_before_fc`, `fc_norm`, `norm_output`, and
  `speculators_config.proposal_methods[0].speculative_tokens` (its training-time-test depth, ours
  `ttt_steps`); tensors `fc.weight`, `layers.0.{self_attn,mlp,input_layernorm,hidden_norm,
  post_attention_layernorm}.*`, `norm.weight`, `lm_head.weight`, `embed_tokens.weight`, `d2t`, `t2d`.
- **SpecForge** (`architectures: ["LlamaForCausalLMEagle3"]`): a `LlamaConfig` with `draft_vocab_size`,
  optional `target_hidden_size` and `eagle_config.eagle_aux_hidden_state_layer_ids` — in SGLang's numbering,
  which names layer *outputs*: its id j is our j + 1; tensors as speculators' with `midlayer.` for `layers.0.`.

`d2t` [N] maps draft row i to target id i + d2t[i]; `t2d` [V] bool marks the target ids drafted (a full-vocabulary
head may carry neither). A checkpoint that does not fit the target — hidden size, vocabulary size, layer ids
past its layers, stop/start token ids or (given both) the tokenizer's vocabulary — is refused with a
`ValueError` naming the field and both values; so is what this head cannot run (more than one draft layer,
`rope_scaling`, an MLP bias, a draft layer type other than llama / qwen3, SpecForge's `norm_output: false`).
speculators' `norm_before_fc`, `fc_norm`, `norm_output` and `norm_before_residual` (and SpecForge's `fc_norm`)
are the head's options (`Eagle3Head`). The checkpoint's `embed_tokens` is checked for shape and dropped: the head
reads the target's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import CONFIG_MAPPING, PreTrainedModel

from specroll.rollout import EngineConfig
from specroll.rollout.drafters.draft_vocab import CARRIED_ATTR
from specroll.rollout.drafters.eagle3 import fresh_head
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head, default_layers

from ..head_file import read_head_file
from ..model_source import ModelPaths, load_head_file
from ..tokenizers import load_tokenizer
from ..vocab_maps import draft_ids, vocab_maps
from .files import read_safetensors

SPECULATORS, SPECFORGE = "speculators", "specforge"
LAYER_TYPES = ("llama", "qwen3")  # the draft decoder layers speculators defines (`model_definitions.model_classes`)
SPECFORGE_ARCHITECTURE = "LlamaForCausalLMEagle3"
VLLM_DEFAULT_AUX_LAYERS = 3  # the fused target layers vLLM's EAGLE-3 draft assumes unless its layer config says
# The head's parameter for each public name after the layer prefix (`layers.0.` / `midlayer.`).
LAYER_NAMES = {
    "self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
    "self_attn.o_proj": "o_proj", "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm",
    "mlp.gate_proj": "gate_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "down_proj",
    "input_layernorm": "input_norm", "hidden_norm": "hidden_norm", "post_attention_layernorm": "mlp_norm",
}
# The fusion's norms: speculators' `norm_before_fc` norm and both layouts' per-layer `fc_norm` (top level).
FUSION_NAMES = {"input_norm": "fc_input_norm", "fc_norm": "fc_norms"}


@dataclass
class Eagle3Spec:
    """What a checkpoint's config.json says, in this project's terms; `fields` names each value's public field."""

    layout: str
    layer: object  # the draft layer's transformers config (defaults filled in)
    target_hidden_size: int
    layers: tuple[int, ...] | None  # our numbering; None: the default for the target
    draft_vocab_size: int
    ttt_steps: int | None
    norm_before_residual: bool
    prefix: str  # the draft layer's tensor prefix
    fields: dict[str, str]  # our name → the checkpoint's field, for messages
    fusion_norm: str | None  # `Eagle3Head.fusion_norm`: norm_before_fc "joint", fc_norm "per_layer"
    norm_output: bool


def read_spec(config: dict) -> Eagle3Spec:
    """The spec of a checkpoint's config.json; `ValueError` for a layout it is not, or an option this head lacks."""
    if config.get("speculators_model_type") == "eagle3":
        return _speculators_spec(config)
    if SPECFORGE_ARCHITECTURE in (config.get("architectures") or []):
        return _specforge_spec(config)
    raise ValueError(f"config.json is not an EAGLE-3 checkpoint this loader knows: speculators_model_type="
                     f"{config.get('speculators_model_type')!r}, architectures={config.get('architectures')!r} "
                     f"(allowed: speculators_model_type 'eagle3', or architectures [{SPECFORGE_ARCHITECTURE!r}])")


def _speculators_spec(config: dict) -> Eagle3Spec:
    layer_dict = dict(config.get("transformer_layer_config") or {})
    model_type = layer_dict.get("model_type", "qwen3")  # speculators' default layer config is Qwen3's
    _refuse_unless(model_type in LAYER_TYPES, "transformer_layer_config.model_type", model_type, LAYER_TYPES)
    _refuse_unless(not (config.get("norm_before_fc") and config.get("fc_norm")), "norm_before_fc and fc_norm",
                   True, "at most one of them (speculators' own rule)")
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    layer = CONFIG_MAPPING[model_type](**layer_dict)
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    fields = {"hidden_size": "transformer_layer_config.hidden_size",
              "vocab_size": "transformer_layer_config.vocab_size",
              "layers": "eagle_aux_hidden_state_layer_ids", "target_hidden_size": "target_hidden_size",
              "layer": "transformer_layer_config"}
    fusion = "joint" if config.get("norm_before_fc") else "per_layer" if config.get("fc_norm") else None
    return Eagle3Spec(SPECULATORS, layer, config.get("target_hidden_size") or layer.hidden_size,
                      None if ids is None else tuple(int(i) for i in ids), int(config.get("draft_vocab_size", 32000)),
                      methods[0].get("speculative_tokens"), bool(config.get("norm_before_residual", False)),
                      "layers.0.", fields, fusion, bool(config.get("norm_output", False)))


def _specforge_spec(config: dict) -> Eagle3Spec:
    _refuse_unless(config.get("norm_output", True), "norm_output", config.get("norm_output"),
                   "true (the LM head reads the normed output)")
    layer = CONFIG_MAPPING["llama"](**{k: v for k, v in config.items() if k not in ("eagle_config", "architectures")})
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    fields = {"hidden_size": "hidden_size", "vocab_size": "vocab_size",
              "layers": "eagle_config.eagle_aux_hidden_state_layer_ids (SGLang numbering, + 1 here)",
              "target_hidden_size": "target_hidden_size", "layer": ""}
    return Eagle3Spec(SPECFORGE, layer, config.get("target_hidden_size") or layer.hidden_size,
                      None if ids is None else tuple(int(i) + 1 for i in ids), int(config["draft_vocab_size"]),
                      None, bool(config.get("norm_before_residual", False)), "midlayer.", fields,
                      "per_layer" if config.get("fc_norm") else None, False)


def read_eagle3_head(models: ModelPaths, engine: EngineConfig, target: PreTrainedModel) -> Eagle3Head:
    """The "eagle3" kind's reader: `models.head` as a public checkpoint folder, a head file over a fresh head, or
    (None) a fresh head; a checkpoint brings its layers, which `engine.eagle3_layers` (if set) must name too."""
    if models.head and Path(models.head).is_dir():
        head = load_eagle3_checkpoint(models.head, target, load_tokenizer(models.target_tokenizer or models.target),
                                      engine.eagle3_ttt_steps)
        if engine.eagle3_layers not in (None, head.target_layers):
            raise ValueError(f"engine.eagle3_layers={engine.eagle3_layers} does not match the checkpoint at "
                             f"models.head={models.head!r}, whose layers are {head.target_layers}: set them or "
                             "leave engine.eagle3_layers unset (the checkpoint decides)")
        return head
    if models.head and "lm_head.weight" in read_head_file(models.head).weights:
        raise ValueError(f"models.head={models.head!r} holds an EAGLE-3 head with its own LM head, whose draft ids "
                         "a state_dict does not carry: give it as a checkpoint folder (speculators or SpecForge "
                         "layout, integrations.formats.eagle3)")
    return load_head_file(fresh_head(engine, target.config), models.head)


def load_eagle3_checkpoint(path: str | Path, target: PreTrainedModel, tokenizer=None,
                           ttt_steps: int = 3) -> Eagle3Head:
    """The head saved at `path` (either layout), checked against `target` (and, if both exist, its tokenizer
    against the one saved beside the checkpoint); `ttt_steps` where the checkpoint does not say (SpecForge)."""
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"EAGLE-3 checkpoint {str(folder)!r} has no config.json")
    spec = read_spec(json.loads(config_file.read_text()))
    layers = check_fits(spec, target)
    _check_tokenizer(folder, tokenizer)
    tensors = read_safetensors(folder, "EAGLE-3 checkpoint")
    draft_ids = _draft_ids(tensors, spec, target.get_output_embeddings().weight.shape[0])
    state = _renamed(tensors, spec, target)
    layer = spec.layer
    heads = layer.num_attention_heads
    head = Eagle3Head(layer.hidden_size, layers, heads, getattr(layer, "num_key_value_heads", None) or heads,
                      getattr(layer, "head_dim", None) or layer.hidden_size // heads, layer.intermediate_size,
                      float(_rope_theta(layer)), layer.rms_norm_eps, draft_ids, spec.ttt_steps or ttt_steps,
                      qk_norm=layer.model_type == "qwen3", attention_bias=bool(getattr(layer, "attention_bias", False)),
                      norm_before_residual=spec.norm_before_residual, fusion_norm=spec.fusion_norm,
                      norm_output=spec.norm_output)
    for name, tensor in state.items():
        expected = head.state_dict().get(name)
        if expected is not None and expected.shape != tensor.shape:
            _differs(f"{name} shape ({spec.fields['layers']}: {len(layers)} layers of hidden_size {layer.hidden_size})",
                     tuple(tensor.shape), tuple(expected.shape))
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"EAGLE-3 checkpoint {str(folder)!r} ({spec.layout} layout) does not hold this head's "
                         f"tensors: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    return head


def save_eagle3_checkpoint(head: Eagle3Head, target: PreTrainedModel, folder: str | Path,
                           verifier: str | None = None) -> Path:
    """`head` as speculators' `Eagle3DraftModel.save_pretrained` lays it out (the module doc's first layout), which
    vLLM serves (`--speculative-config '{"method": "eagle3", "model": "<folder>"}'`) and `load_eagle3_checkpoint`
    reads back: config.json (`Eagle3SpeculatorConfig`'s fields, the draft layer's config a `llama` one, `qwen3`
    with q/k norms) and model.safetensors (fp32: `layers.0.*`, `fc`, `norm`, the fusion norms, `lm_head` [N, H]
    and `d2t` / `t2d` for an own LM head over N < V ids, `embed_tokens` the target's). `verifier`: the target's
    folder or hub id, recorded as speculators records it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = target.config.get_text_config()
    vocab = target.get_output_embeddings().weight.shape[0]
    layer_type = "qwen3" if head.q_norm is not None else "llama"
    layer = CONFIG_MAPPING[layer_type](
        hidden_size=head.hidden_size, intermediate_size=head.gate_proj.weight.shape[0], num_hidden_layers=1,
        num_attention_heads=head.num_heads, num_key_value_heads=head.num_kv_heads, head_dim=head.head_dim,
        vocab_size=vocab, rms_norm_eps=head.norm.eps, rope_theta=theta_of(head.inv_freq, head.head_dim),
        attention_bias=head.q_proj.bias is not None, tie_word_embeddings=False,
        max_position_embeddings=getattr(text, "max_position_embeddings", 2048),
        bos_token_id=getattr(text, "bos_token_id", None), eos_token_id=getattr(text, "eos_token_id", None))
    if len(head.target_layers) != VLLM_DEFAULT_AUX_LAYERS:
        # vLLM (0.32) sizes the draft's `fc` from the layer config's `num_aux_hidden_states` (else 3), not from
        # `eagle_aux_hidden_state_layer_ids`, which its target side reads: said here for a head fusing other than 3
        layer.num_aux_hidden_states = len(head.target_layers)
    # an own LM head's rows, else the draft vocabulary it was trained over (`carry`): over the target's LM head's
    # rows at those ids, as the engine's `draft_vocab` drafts it
    ids = head.draft_ids if head.draft_ids is not None else getattr(head, CARRIED_ATTR, None)
    config = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "transformer_layer_config": layer.to_diff_dict(),
        "draft_vocab_size": vocab if ids is None else int(ids.numel()),
        "norm_before_residual": head.norm_before_residual, "target_hidden_size": text.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(head.target_layers),
        "norm_before_fc": head.fc_input_norm is not None, "fc_norm": head.fc_norms is not None,
        "norm_output": head.norm_output, "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": head.ttt_steps,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": list(target.config.architectures or [])},
        },
        "torch_dtype": "float32",
    }
    tensors = speculators_tensors(head, target, ids)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def speculators_tensors(head: Eagle3Head, target: PreTrainedModel, ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """`head`'s tensors under the speculators layout's names (fp32), drafting over the target ids `ids` (None: all):
    what `save_eagle3_checkpoint` writes and vLLM's EAGLE-3 proposer loads in place (`integrations.vllm.backend`).
    A head without an LM head of its own takes the target's rows at `ids` — and the target's embedding —, so these
    follow the policy only when built again after a policy sync."""
    to_public = {local: f"layers.0.{name}" for name, local in LAYER_NAMES.items()}
    to_public.update({local: name for name, local in FUSION_NAMES.items()})
    # copies: a tied target's embedding and LM head are one tensor, which safetensors refuses to write twice
    tensors = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().float().clone()}
    for name, tensor in head.state_dict().items():
        module, _, rest = name.partition(".")
        tensors[f"{to_public.get(module, module)}.{rest}"] = tensor.detach().float()
    if head.lm_head is None:  # drafts through the target's LM head: speculators' layout has one of its own
        lm_head = target.get_output_embeddings().weight.detach().float()
        tensors["lm_head.weight"] = lm_head.clone() if ids is None else lm_head[ids]
    tensors.update(vocab_maps(ids, target.get_output_embeddings().weight.shape[0]))
    return tensors


def theta_of(inv_freq: torch.Tensor, head_dim: int) -> float:
    """RoPE's base from a head's frequencies (inv_freq[1] = theta^(-2/head_dim)), to the 6 digits a config holds."""
    if inv_freq.numel() < 2:
        return 10000.0
    return float(f"{float(inv_freq[1].double() ** (-head_dim / 2)):.6g}")


def check_fits(spec: Eagle3Spec, target: PreTrainedModel) -> tuple[int, ...]:
    """The checkpoint's target layers (our numbering), after refusing what does not fit `target` or this head."""
    text = target.config.get_text_config()
    layer, fields = spec.layer, spec.fields
    prefix = f"{fields['layer']}." if fields["layer"] else ""
    _refuse_unless(layer.num_hidden_layers == 1, f"{prefix}num_hidden_layers", layer.num_hidden_layers, "1")
    _refuse_unless(not getattr(layer, "mlp_bias", False), f"{prefix}mlp_bias", True, "false")
    rope = getattr(layer, "rope_scaling", None) or getattr(layer, "rope_parameters", None) or {}
    _refuse_unless(rope.get("rope_type", rope.get("type", "default")) == "default", f"{prefix}rope_scaling", rope,
                   "none (plain RoPE)")
    _differs(fields["hidden_size"], layer.hidden_size, text.hidden_size)
    _differs(fields["target_hidden_size"], spec.target_hidden_size, text.hidden_size)
    vocab = target.get_output_embeddings().weight.shape[0]
    _differs(fields["vocab_size"], layer.vocab_size, vocab)
    for name in ("eos_token_id", "bos_token_id"):
        ours, theirs = getattr(text, name, None), getattr(layer, name, None)
        if ours is not None and theirs is not None:
            _differs(f"{prefix}{name}", theirs, ours)
    layers = spec.layers or default_layers(text.num_hidden_layers)
    count = text.num_hidden_layers
    if list(layers) != sorted(set(layers)) or layers[0] < 0 or layers[-1] >= count:
        raise ValueError(f"EAGLE-3 checkpoint {fields['layers']} = {list(spec.layers)} does not fit the target: it "
                         f"has {count} decoder layers (ids 0..{count - 1}, distinct and sorted)")
    return tuple(layers)


def _draft_ids(tensors: dict[str, torch.Tensor], spec: Eagle3Spec, vocab: int) -> torch.Tensor | None:
    """The target ids of the head's LM head rows (`vocab_maps.draft_ids`: from `d2t`, checked against `t2d`); every
    id when the head spans the whole vocabulary without a map."""
    return draft_ids(tensors.pop("d2t", None), tensors.pop("t2d", None), spec.draft_vocab_size, vocab)


def _renamed(tensors: dict[str, torch.Tensor], spec: Eagle3Spec, target: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the head's names (fp32); its `embed_tokens` checked for shape and dropped."""
    embed = tensors.pop("embed_tokens.weight", None)
    if embed is not None:
        _differs("embed_tokens.weight shape", tuple(embed.shape), tuple(target.get_input_embeddings().weight.shape))
    state = {}
    for name, tensor in tensors.items():
        local = name
        if name.startswith(spec.prefix):
            module, _, kind = name[len(spec.prefix) :].rpartition(".")
            local = f"{LAYER_NAMES.get(module, module)}.{kind}"
        elif name.split(".")[0] in FUSION_NAMES:
            first, _, rest = name.partition(".")
            local = f"{FUSION_NAMES[first]}.{rest}"
        state[local] = tensor.float()
    return state


def _check_tokenizer(folder: Path, tokenizer) -> None:
    """The tokenizer saved with the checkpoint (if any) must number tokens as the target's (if given) does."""
    saved = load_tokenizer(str(folder)) if tokenizer is not None else None
    if saved is None:
        return
    ours, theirs = tokenizer.get_vocab(), saved.get_vocab()
    differ = sorted(tok for tok in set(ours) | set(theirs) if ours.get(tok) != theirs.get(tok))
    if differ:
        tok = differ[0]
        raise ValueError(f"EAGLE-3 checkpoint tokenizer differs from the target's: {len(differ)} tokens numbered "
                         f"differently, e.g. {tok!r}: {theirs.get(tok)} in the checkpoint, {ours.get(tok)} in the "
                         "target")


def _rope_theta(layer) -> float:
    return getattr(layer, "rope_theta", None) or (getattr(layer, "rope_parameters", None) or {}).get(
        "rope_theta", 10000.0)


def _differs(field: str, theirs, ours) -> None:
    if theirs != ours:
        raise ValueError(f"EAGLE-3 checkpoint does not fit the target: {field} is {theirs} in the checkpoint, "
                         f"{ours} in the target")


def _refuse_unless(ok: bool, field: str, value, allowed) -> None:
    if not ok:
        raise ValueError(f"EAGLE-3 checkpoint {field}={value!r} is not supported: {allowed}")
