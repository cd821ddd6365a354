"""In-place weight loading by parameter name, validated before anything is written."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def check_fits(model: torch.nn.Module, named_tensors: Mapping[str, torch.Tensor], role: str) -> None:
    """Raise ValueError unless every name is a parameter/buffer of `model` with the tensor's shape."""
    params = _named_tensors(model)
    unknown = [name for name in named_tensors if name not in params]
    if unknown:
        raise ValueError(f"{role} has no parameters named {unknown[:5]} ({len(unknown)} unknown names)")
    for name, tensor in named_tensors.items():
        if params[name].shape != tensor.shape:
            raise ValueError(f"{role} parameter {name}: shape {tuple(tensor.shape)} != {tuple(params[name].shape)}")


@torch.no_grad()
def copy_into(model: torch.nn.Module, named_tensors: Mapping[str, torch.Tensor], role: str) -> None:
    """Copy `named_tensors` into `model`'s parameters/buffers of the same names (a subset is fine).

    Every name and shape is checked first (`check_fits`), so a bad update changes nothing.
    """
    check_fits(model, named_tensors, role)
    params = _named_tensors(model)
    for name, tensor in named_tensors.items():
        params[name].copy_(tensor)


def _named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters()) | dict(model.named_buffers())
