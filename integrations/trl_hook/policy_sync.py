"""Read a trainer's policy weights as full named tensors, whatever wraps the model.

Used by the TRL hook before each weight sync::

    named = gather_policy_weights(trainer.accelerator.unwrap_model(trainer.model), keep=is_main)

Three cases, one walk:

- **plain model**: parameters are read as they are;
- **DeepSpeed ZeRO-3**: each module's parameters are gathered inside
  `deepspeed.zero.GatheredParameters` (a collective: every rank must call this function, with the
  same model, even those that keep nothing — pass `keep=False` there);
- **PEFT**: the adapter is merged into the base weights, the merged base weights are read under the
  base model's own names (`base_model.model.` and `.base_layer` stripped, `lora_*` tensors and
  `modules_to_save` originals skipped), and the adapter is unmerged before returning — also when
  reading fails. Under ZeRO-3 the whole model is gathered at once first, because a LoRA layer
  cannot be merged from shards (the same choice as TRL's vLLM sync).

Tensors are detached CPU copies, so the caller may ship them anywhere after the model moves on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

_PEFT_PREFIX = "base_model.model."
_PEFT_SKIP = ("original_module",)
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def gather_policy_weights(model: torch.nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """Full policy weights by the base model's parameter names (CPU copies); `{}` when `keep=False`.

    Every rank of a ZeRO-3 job must call this (the gathers are collective); only the ranks that send
    the weights need `keep=True`.
    """
    if _is_peft(model):
        return _gather_peft(model, keep)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in _walk_gathered(model):
        if keep:
            out[_strip_wrappers(name)] = tensor.detach().to("cpu", copy=True)
    return out


def is_zero3(model: torch.nn.Module) -> bool:
    """True when the model's parameters are partitioned by DeepSpeed ZeRO-3."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def _walk_gathered(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) module by module; ZeRO-3 shards are gathered one module at a time."""
    seen: set[int] = set()
    zero3 = is_zero3(model)
    for module_name, module in model.named_modules():
        params = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        if not params:
            continue
        seen.update(id(p) for _, p in params)
        with _gathered((p for _, p in params), zero3):
            for name, param in params:
                yield (f"{module_name}.{name}" if module_name else name), param.data


def _gather_peft(model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    adapter_prefix = getattr(model, "prefix", None) or getattr(model.base_model, "prefix", "lora_")
    out: dict[str, torch.Tensor] = {}
    with _gathered(model.parameters(), is_zero3(model)):
        model.merge_adapter()
        try:
            if keep:
                for name, param in model.named_parameters():
                    if adapter_prefix in name or any(s in name for s in _PEFT_SKIP):
                        continue
                    name = name.removeprefix(_PEFT_PREFIX).replace(".base_layer", "")
                    name = name.replace("modules_to_save.default.", "")
                    out[_strip_wrappers(name)] = param.data.detach().to("cpu", copy=True)
        finally:
            model.unmerge_adapter()
    return out


@contextlib.contextmanager
def _gathered(params: Iterable[torch.nn.Parameter], zero3: bool):
    if not zero3:
        yield
        return
    import deepspeed  # only a ZeRO-3 model can reach here, so deepspeed is installed

    with deepspeed.zero.GatheredParameters(list(params), modifier_rank=None):
        yield


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "merge_adapter") and hasattr(model, "peft_config")


def _strip_wrappers(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.removeprefix(prefix)
    return name
