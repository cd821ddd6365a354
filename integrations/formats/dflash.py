"""Public DFlash checkpoints (z-lab's layout and the speculators library's) as `BlockHead`s, and a head written in
either (`save_block_checkpoint`: what `specroll train` / `distill` / `export` keep).

    head = load_block_checkpoint("path/to/checkpoint", target)   # refuses what does not fit
    engine = SpecEngine(target, head, EngineConfig(drafters=("block",)))
    save_block_checkpoint(head, target, "out/drafter", layout="speculators", verifier="out/policy")

The layout, as read from z-lab/dflash at commit 44947fbf71114e241c96de194f4b382b5dd330d0 (`dflash/model.py`:
`DFlashDraftModel`, a `Qwen3PreTrainedModel`; `dflash/model_mlx.py`: `load_draft`, which reads the same files):
a folder with `config.json` and `model.safetensors` (or shards listed in `model.safetensors.index.json`).

- config.json: a Qwen3 config of the draft layers (`hidden_size`, `num_hidden_layers` — the draft's layers,
  `num_attention_heads`, `num_key_value_heads`, `head_dim`, `intermediate_size`, `vocab_size`, `rms_norm_eps`,
  `rope_theta`, `rope_scaling`, `attention_bias`, `layer_types`) plus `block_size`, `num_target_layers` and
  `dflash_config: {target_layer_ids, mask_token_id}`. `target_layer_ids` name target layer *outputs*
  (`extract_context_feature` reads `hidden_states[id + 1]`); absent, `build_target_layer_ids(num_target_layers,
  num_hidden_layers)` (our `default_layers` spread, with that count).
- tensors (no embedding, no LM head: the target's): `fc.weight`, `hidden_norm.weight`, `norm.weight`, and per
  draft layer i `layers.{i}.self_attn.{q,k,v,o}_proj.weight` (+ `.bias` with `attention_bias`),
  `layers.{i}.self_attn.{q,k}_norm.weight`, `layers.{i}.mlp.{gate,up,down}_proj.weight`,
  `layers.{i}.input_layernorm.weight`, `layers.{i}.post_attention_layernorm.weight` — `BlockHead`'s own names.

The speculators layout (vllm-project/speculators at c05b95b: `models/dflash/config.py`, `DFlashSpeculatorConfig`;
`convert/dflash/converter.py`, which turns z-lab's into it; what vLLM serves as `"method": "dflash"`):
config.json with `speculators_model_type: "dflash"`, `transformer_layer_config` (a `qwen3` config's diff dict),
`draft_vocab_size`, `block_size`, `target_hidden_size`, `aux_hidden_state_layer_ids` (HF `hidden_states` indices:
z-lab's id + 1, our `capture_layers`), `mask_token_id` and `speculators_config`; tensors the same body plus
`embed_tokens.weight` [V, H], `lm_head.weight` [N, H] (the target's rows the head drafts) and, over N < V ids,
`d2t` / `t2d` (`vocab_maps`). Read back: the draft ids from the maps (`carry`), the checkpoint's `lm_head` checked
for shape and dropped (the head drafts through the target's).

The mask positions' input is the checkpoint's `embed_tokens` row of `mask_token_id` in the speculators layout, the
target's in z-lab's (DFlash's `noise_embedding`), copied into the head's `mask_embedding`; our own z-lab writes add the
trained vector as a `mask_embedding` tensor where it is no row of the target's (z-lab's loader ignores it and drafts
with the target's row: the only thing that layout cannot carry). A checkpoint that does not fit the target —
`hidden_size`, `vocab_size`, `num_target_layers`, `target_layer_ids` past what verification captures (below the last
layer), `mask_token_id` past the vocabulary — is refused with a `ValueError` naming the field and both values; so is
what this head cannot run (`rope_scaling`, sliding-window `layer_types`), and a tensor missing, unexpected or of another
shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import CONFIG_MAPPING, PreTrainedModel

from specroll.rollout import EngineConfig
from specroll.rollout.drafters.block import fresh_head
from specroll.rollout.drafters.draft_vocab import CARRIED_ATTR, carry
from specroll.rollout.drafters.heads.block import BlockHead, default_layers

from ..model_source import ModelPaths, load_head_file
from ..vocab_maps import draft_ids, vocab_maps
from .eagle3 import theta_of
from .files import read_safetensors

SPECULATORS, ZLAB = "speculators", "zlab"
LAYOUTS = (SPECULATORS, ZLAB)
CONFIG_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                 "vocab_size", "block_size", "num_target_layers")


def load_block_checkpoint(path: str | Path, target: PreTrainedModel) -> BlockHead:
    """The block head saved at `path` (z-lab's DFlash layout or speculators'), checked against `target`."""
    path = Path(path)
    config = _read_config(path)
    text = target.config.get_text_config()
    embedding = target.get_input_embeddings().weight.detach()
    layers = _check_fits(config, text, embedding.shape[0], path)
    heads = config["num_attention_heads"]
    head = BlockHead(config["hidden_size"], layers, config["num_hidden_layers"], heads, config["num_key_value_heads"],
                     config.get("head_dim") or config["hidden_size"] // heads, config["intermediate_size"],
                     config["block_size"], float(config.get("rope_theta", 10000.0)),
                     float(config.get("rms_norm_eps", 1e-6)), bool(config.get("attention_bias", False)))
    weights = read_safetensors(path, "DFlash checkpoint")
    mask_id = config["dflash_config"]["mask_token_id"]
    ids = None
    if config.get("speculators_model_type") == "dflash":
        own = _checked(weights.pop("embed_tokens.weight", None), embedding.shape, "embed_tokens.weight", path)
        embedding = embedding if own is None else own
        size = config.get("draft_vocab_size") or embedding.shape[0]
        ids = draft_ids(weights.pop("d2t", None), weights.pop("t2d", None), size, embedding.shape[0])
        _checked(weights.pop("lm_head.weight", None), (size, config["hidden_size"]), "lm_head.weight", path)
        ids = None if ids.numel() == embedding.shape[0] else ids
    mask = weights.pop("mask_embedding", None)
    expected = {name: tensor.shape for name, tensor in head.state_dict().items() if name != "mask_embedding"}
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ValueError(f"DFlash checkpoint at {path} does not hold the tensors its config.json describes: missing "
                         f"{missing[:6]}, unexpected {unexpected[:6]}")
    for name, shape in expected.items():
        if weights[name].shape != shape:
            raise ValueError(f"DFlash checkpoint at {path}: tensor {name} is {tuple(weights[name].shape)}, its "
                             f"config.json makes it {tuple(shape)}")
    weights["mask_embedding"] = embedding[mask_id] if mask is None else mask
    head.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    return carry(head, ids)


def save_block_checkpoint(head: BlockHead, target: PreTrainedModel, folder: str | Path, layout: str = SPECULATORS,
                          verifier: str | None = None) -> Path:
    """`head` written in `layout` ("speculators" or "zlab", the module doc's) with its draft vocabulary (`carry`'s,
    if any; speculators' layout only), as `load_block_checkpoint` reads it back. The mask token is the target
    id whose embedding the trained `mask_embedding` is (a head read from a checkpoint), else the last id of the
    target's embedding (in speculators' `embed_tokens` that row is the trained vector). `verifier`: the target's
    folder or hub id, recorded as speculators records it."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is invalid: one of {LAYOUTS}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = target.config.get_text_config()
    embedding = target.get_input_embeddings().weight.detach().float()
    vocab, hidden = embedding.shape
    mask = head.mask_embedding.detach().float()
    rows = (embedding == mask).all(dim=1).nonzero()[:, 0]
    mask_id = int(rows[0]) if rows.numel() else vocab - 1
    first = head.layers[0].self_attn
    layer = {"model_type": "qwen3", "hidden_size": hidden, "num_hidden_layers": len(head.layers),
             "num_attention_heads": head.num_heads, "num_key_value_heads": head.num_kv_heads,
             "head_dim": head.head_dim, "intermediate_size": head.layers[0].mlp.gate_proj.weight.shape[0],
             "vocab_size": vocab, "rms_norm_eps": head.norm.eps, "rope_theta": theta_of(head.inv_freq, head.head_dim),
             "attention_bias": first.q_proj.bias is not None, "tie_word_embeddings": False,
             "max_position_embeddings": getattr(text, "max_position_embeddings", 2048),
             "layer_types": ["full_attention"] * len(head.layers)}
    tensors = {name: t.detach().float() for name, t in head.state_dict().items() if name != "mask_embedding"}
    if layout == ZLAB:
        config = {**layer, "architectures": ["DFlashDraftModel"], "block_size": head.block_size,
                  "num_target_layers": text.num_hidden_layers,
                  "dflash_config": {"target_layer_ids": list(head.target_layers), "mask_token_id": mask_id}}
        if not rows.numel():
            tensors["mask_embedding"] = mask
    else:
        ids = getattr(head, CARRIED_ATTR, None)
        size = vocab if ids is None else int(ids.numel())
        lm_head = target.get_output_embeddings().weight.detach().float()
        embedding = embedding.clone()
        embedding[mask_id] = mask
        tensors.update({"embed_tokens.weight": embedding,
                        "lm_head.weight": lm_head if ids is None else lm_head[ids], **vocab_maps(ids, vocab)})
        config = {
            "architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash",
            "transformer_layer_config": CONFIG_MAPPING["qwen3"](**layer).to_diff_dict(),
            "draft_vocab_size": size, "block_size": head.block_size, "target_hidden_size": text.hidden_size,
            "aux_hidden_state_layer_ids": list(head.capture_layers), "mask_token_id": mask_id,
            "sliding_window_non_causal": False, "sample_from_anchor": False,
            "speculators_config": {
                "algorithm": "dflash", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": head.block_size - 1,
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "verifier": {"name_or_path": verifier, "architectures": list(target.config.architectures or [])},
            },
            "torch_dtype": "float32",
        }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def _checked(tensor: torch.Tensor | None, shape, name: str, path: Path) -> torch.Tensor | None:
    """`tensor` (None if the checkpoint has none) after checking its shape against the target's."""
    if tensor is not None and tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"DFlash checkpoint at {path} does not fit the target: {name} is {tuple(tensor.shape)} in "
                         f"the checkpoint, {tuple(shape)} for the target")
    return tensor


def read_block_head(models: ModelPaths, engine: EngineConfig, target: PreTrainedModel) -> BlockHead:
    """The "block" kind's reader: `models.head` as a z-lab DFlash checkpoint folder, a head file over a fresh head,
    or (None) a fresh head (`engine.block_layers`, `engine.block_size`); the engine checks a checkpoint's layers
    against `engine.block_layers` (`drafters.block.check_fits`)."""
    if models.head and Path(models.head).is_dir():
        return load_block_checkpoint(models.head, target)
    return load_head_file(fresh_head(engine, target.config), models.head)


def _read_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.is_file():
        raise ValueError(f"no DFlash checkpoint at {path}: a folder with config.json and model.safetensors expected")
    config = json.loads(file.read_text())
    if config.get("speculators_model_type") == "dflash":
        config = _from_speculators(config)
    missing = [name for name in CONFIG_FIELDS if name not in config]
    if missing or not isinstance(config.get("dflash_config"), dict) or "mask_token_id" not in config["dflash_config"]:
        raise ValueError(f"DFlash checkpoint config {file} lacks {missing or ['dflash_config.mask_token_id']}: "
                         "not z-lab's layout")
    if config.get("rope_scaling"):
        raise ValueError(f"DFlash checkpoint config {file}: rope_scaling={config['rope_scaling']!r} is not supported "
                         "(plain RoPE only)")
    if any(kind != "full_attention" for kind in config.get("layer_types") or ()):
        raise ValueError(f"DFlash checkpoint config {file}: layer_types={config['layer_types']!r} is not supported "
                         "(full attention only)")
    return config


def _from_speculators(config: dict) -> dict:
    """A speculators DFlash config.json in z-lab's terms (the draft layers' fields at the top level, our layer ids;
    `num_target_layers` None: speculators does not record it)."""
    layer = CONFIG_MAPPING["qwen3"](**{k: v for k, v in (config.get("transformer_layer_config") or {}).items()
                                       if k != "model_type"}).to_dict()
    rope = layer.get("rope_parameters") or {}
    ids = config.get("aux_hidden_state_layer_ids")
    return {**layer, "rope_theta": layer.get("rope_theta") or rope.get("rope_theta", 10000.0),
            "rope_scaling": None if rope.get("rope_type", "default") == "default" else rope,
            "speculators_model_type": "dflash", "block_size": config.get("block_size"), "num_target_layers": None,
            "draft_vocab_size": config.get("draft_vocab_size"),
            "dflash_config": {"target_layer_ids": None if ids is None else [int(i) - 1 for i in ids],
                              "mask_token_id": config.get("mask_token_id")}}


def _check_fits(config: dict, text, vocab_size: int, path: Path) -> tuple[int, ...]:
    """The checkpoint's target layers, after checking every field that must match the target."""
    for field, theirs, ours in (("hidden_size", config["hidden_size"], text.hidden_size),
                                ("vocab_size", config["vocab_size"], vocab_size),
                                ("num_target_layers", config["num_target_layers"], text.num_hidden_layers)):
        if theirs is not None and theirs != ours:
            raise ValueError(f"DFlash checkpoint at {path} does not fit the target: {field}={theirs} in the "
                             f"checkpoint, {ours} in the target")
    count = text.num_hidden_layers
    layers = config["dflash_config"].get("target_layer_ids")
    layers = tuple(layers) if layers is not None else default_layers(count, config["num_hidden_layers"])
    if not layers or list(layers) != sorted(set(layers)) or layers[0] < 0 or layers[-1] > count - 2:
        raise ValueError(f"DFlash checkpoint at {path} does not fit the target: target_layer_ids={list(layers)} in "
                         f"the checkpoint, the target's {count} layers give ids in [0, {count - 2}] (outputs below "
                         "the last)")
    mask_id = config["dflash_config"]["mask_token_id"]
    if not (isinstance(mask_id, int) and 0 <= mask_id < vocab_size):
        raise ValueError(f"DFlash checkpoint at {path} does not fit the target: mask_token_id={mask_id!r} in the "
                         f"checkpoint, the target's vocabulary has {vocab_size} ids")
    return layers


