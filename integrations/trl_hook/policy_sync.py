"""Read a trainer's policy weights as full named tensors, whatever wraps the model.

Used by the TRL hook before each weight sync::

    named = gather_policy_weights(trainer.accelerator.unwrap_model(trainer.model), keep=is_main)

Three cases, one walk over the modules (`iter_policy_weights`), one module at a time:

- **plain model**: parameters are read as they are (no copy);
- **DeepSpeed ZeRO-3**: each module's parameters are gathered inside
  `deepspeed.zero.GatheredParameters` while they are read (a collective: every rank must call this
  function, with the same model, even those that keep nothing — pass `keep=False` there), so no rank
  ever holds more than one module's full parameters;
- **PEFT**: each LoRA layer is merged into its base weight while that layer is read, and unmerged
  before the walk moves on — also when reading fails. Under ZeRO-3 the layer's base weight and its
  adapter are gathered together for that time (a LoRA layer cannot be merged from shards). The
  merged base weights come out under the base model's own names (`base_model.model.` and
  `.base_layer` stripped, `lora_*` tensors and `modules_to_save` originals skipped).

`gather_policy_weights` returns what outlives the walk: gathered or merged tensors are copied to the
CPU (a ZeRO-3 model's full weights may not fit on one GPU); a plain model's are the parameters
themselves, detached — read them before the optimizer steps again (a sync does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

_PEFT_PREFIX = "base_model.model."
_PEFT_SKIP = ("original_module",)
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")


@dataclass(frozen=True)
class PolicyTensor:
    """One full policy tensor from the walk; `transient`: gathered or merged, valid until the walk moves on."""

    name: str
    tensor: torch.Tensor
    transient: bool


def gather_policy_weights(model: torch.nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """Full policy weights by the base model's parameter names; `{}` when `keep=False`.

    Every rank of a ZeRO-3 job must call this (the gathers are collective); only the ranks that send
    the weights need `keep=True`.
    """
    out: dict[str, torch.Tensor] = {}
    for item in iter_policy_weights(model):
        if keep:
            out[item.name] = item.tensor.detach().to("cpu", copy=True) if item.transient else item.tensor.detach()
    return out


def is_zero3(model: torch.nn.Module) -> bool:
    """True when the model's parameters are partitioned by DeepSpeed ZeRO-3."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def iter_policy_weights(model: torch.nn.Module) -> Iterator[PolicyTensor]:
    """Each full policy tensor, module by module (a LoRA layer with its adapter); see the module docstring."""
    zero3 = is_zero3(model)
    tuner_layer = _tuner_layer_class() if _is_peft(model) else None
    adapter_prefix = (getattr(model, "prefix", None) or getattr(model.base_model, "prefix", "lora_")
                      if tuner_layer is not None else None)
    seen: set[int] = set()
    inside = None  # the prefix of the LoRA layer last read: its submodules were read with it
    for module_name, module in model.named_modules():
        if inside is not None and module_name.startswith(inside):
            continue
        merge = tuner_layer is not None and isinstance(module, tuner_layer)
        params = [(n, p) for n, p in module.named_parameters(recurse=merge) if id(p) not in seen]
        if not params:
            continue
        seen.update(id(p) for _, p in params)
        if merge:
            inside = f"{module_name}."
        with _gathered((p for _, p in params), zero3), _merged(module, merge):
            for name, param in params:
                full = f"{module_name}.{name}" if module_name else name
                if adapter_prefix is not None:
                    if adapter_prefix in full or any(s in full for s in _PEFT_SKIP):
                        continue
                    full = full.removeprefix(_PEFT_PREFIX).replace(".base_layer", "")
                    full = full.replace("modules_to_save.default.", "")
                yield PolicyTensor(_strip_wrappers(full), param.data, zero3 or merge)


@contextlib.contextmanager
def _gathered(params: Iterable[torch.nn.Parameter], zero3: bool):
    if not zero3:
        yield
        return
    import deepspeed  # only a ZeRO-3 model can reach here, so deepspeed is installed

    with deepspeed.zero.GatheredParameters(list(params), modifier_rank=None):
        yield


@contextlib.contextmanager
def _merged(layer: torch.nn.Module, merge: bool):
    """A PEFT tuner layer merged into its base weight for the time of the block (unmerged also on error)."""
    if not merge:
        yield
        return
    layer.merge()
    try:
        yield
    finally:
        layer.unmerge()


def _tuner_layer_class() -> type:
    from peft.tuners.tuners_utils import BaseTunerLayer  # only a PEFT model reaches here, so peft is installed

    return BaseTunerLayer


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "merge_adapter") and hasattr(model, "peft_config")


def _strip_wrappers(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.removeprefix(prefix)
    return name
