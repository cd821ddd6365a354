"""Reading a checkpoint folder's weights: one `model.safetensors`, or the shards its index names."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def read_safetensors(folder: str | Path, what: str) -> dict[str, torch.Tensor]:
    """Every tensor in `folder`'s `model.safetensors` or in the shards `model.safetensors.index.json` names;
    ValueError naming `what` (e.g. "EAGLE-3 checkpoint") and the folder when it has neither."""
    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {name: tensor for shard in shards for name, tensor in load_file(folder / shard).items()}
    raise ValueError(f"{what} at {str(folder)!r} has no model.safetensors (nor model.safetensors.index.json)")
