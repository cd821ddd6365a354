"""In-place weight loading by parameter name, validated before anything is written."""

from __future__ import annotations

from collections.abc import Mapping

import torch


@torch.no_grad()
def copy_into(model: torch.nn.Module, named_tensors: Mapping[str, torch.Tensor], role: str) -> None:
    """Copy `named_tensors` into `model`'s parameters/buffers of the same names (a subset is fine).

    Every name and shape is checked first, so a bad update changes nothing.
    """
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    unknown = [name for name in named_tensors if name not in params]
    if unknown:
        raise ValueError(f"{role} has no parameters named {unknown[:5]} ({len(unknown)} unknown names)")
    for name, tensor in named_tensors.items():
        if params[name].shape != tensor.shape:
            raise ValueError(f"{role} parameter {name}: shape {tuple(tensor.shape)} != {tuple(params[name].shape)}")
    for name, tensor in named_tensors.items():
        params[name].copy_(tensor)
