"""Public DFlash checkpoints (z-lab's layout) as `BlockHead`s.

    head = load_block_checkpoint("path/to/checkpoint", target)   # refuses what does not fit
    engine = SpecEngine(target, head, EngineConfig(drafters=("block",)))

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

The mask positions' input is the target's embedding of `mask_token_id` (DFlash's `noise_embedding`), copied into
the head's `mask_embedding`. A checkpoint that does not fit the target — `hidden_size`, `vocab_size`,
`num_target_layers`, `target_layer_ids` past what verification captures (below the last layer), `mask_token_id`
past the vocabulary — is refused with a `ValueError` naming the field and both values; so is what this head
cannot run (`rope_scaling`, sliding-window `layer_types`), and a tensor missing, unexpected or of another shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from specroll.rollout.drafters.block_head import BlockHead, default_layers

CONFIG_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                 "vocab_size", "block_size", "num_target_layers")


def load_block_checkpoint(path: str | Path, target: PreTrainedModel) -> BlockHead:
    """The block head saved at `path` (z-lab's DFlash layout), checked against `target`."""
    path = Path(path)
    config = _read_config(path)
    text = target.config.get_text_config()
    layers = _check_fits(config, text, target.get_input_embeddings().weight.shape[0], path)
    heads = config["num_attention_heads"]
    head = BlockHead(config["hidden_size"], layers, config["num_hidden_layers"], heads, config["num_key_value_heads"],
                     config.get("head_dim") or config["hidden_size"] // heads, config["intermediate_size"],
                     config["block_size"], float(config.get("rope_theta", 10000.0)),
                     float(config.get("rms_norm_eps", 1e-6)), bool(config.get("attention_bias", False)))
    weights = _read_weights(path)
    expected = {name: tensor.shape for name, tensor in head.state_dict().items() if name != "mask_embedding"}
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ValueError(f"DFlash checkpoint at {path} does not hold the tensors its config.json describes: missing "
                         f"{missing[:6]}, unexpected {unexpected[:6]}")
    for name, shape in expected.items():
        if weights[name].shape != shape:
            raise ValueError(f"DFlash checkpoint at {path}: tensor {name} is {tuple(weights[name].shape)}, its "
                             f"config.json makes it {tuple(shape)}")
    mask_id = config["dflash_config"]["mask_token_id"]
    weights["mask_embedding"] = target.get_input_embeddings().weight.detach()[mask_id]
    head.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    return head


def _read_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.is_file():
        raise ValueError(f"no DFlash checkpoint at {path}: a folder with config.json and model.safetensors expected")
    config = json.loads(file.read_text())
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


def _check_fits(config: dict, text, vocab_size: int, path: Path) -> tuple[int, ...]:
    """The checkpoint's target layers, after checking every field that must match the target."""
    for field, theirs, ours in (("hidden_size", config["hidden_size"], text.hidden_size),
                                ("vocab_size", config["vocab_size"], vocab_size),
                                ("num_target_layers", config["num_target_layers"], text.num_hidden_layers)):
        if theirs != ours:
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


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {name: tensor for shard in shards for name, tensor in load_file(path / shard).items()}
    raise ValueError(f"DFlash checkpoint at {path} has no model.safetensors (nor model.safetensors.index.json)")
