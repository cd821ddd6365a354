"""Weights in place: loading by parameter name, validated before anything is written, and casting a model to
the engine's dtype with its rotary frequencies kept in fp32."""

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


# Buffers that stay fp32 whatever the model's dtype: rotary inverse frequencies. HF builds them in fp32 for a
# bf16 model and its trainer computes logprobs with them so; `Module.to(dtype)` would cast them too, and bf16
# frequencies (8 mantissa bits) turn into angle errors that grow with position (at position 8k, θ = 1e6,
# whole radians): rollout logprobs then drift from the trainer's with length.
FP32_BUFFER_SUFFIXES = ("inv_freq",)


def cast_module(module: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """`module.to(device, dtype)` in place, but fp32 rotary frequency buffers (`FP32_BUFFER_SUFFIXES`) stay fp32."""
    keep = {name: buffer.detach().clone() for name, buffer in module.named_buffers()
            if name.endswith(FP32_BUFFER_SUFFIXES) and buffer.dtype == torch.float32}
    module.to(device=device, dtype=dtype)
    for name, buffer in keep.items():
        owner, _, attr = name.rpartition(".")
        setattr(module.get_submodule(owner) if owner else module, attr, buffer.to(device))
    return module


def _named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters()) | dict(model.named_buffers())
