"""The keyword a transformers forward takes its cache by: `cache` from transformers 5.18 on, `past_key_values`
before (5.17: the GPU machine's image), `cache_params` for some recurrent models of those versions.

specroll supports both sides of the rename (pyproject pins the lower bound): every call that hands a model or
module a cache goes through `cache_kwargs`, and a forward we replace (`mixers.RaggedMixer`) takes the cache
under whichever name its caller used (`pop_cache`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import Any

CACHE_NAMES = ("cache", "past_key_values", "cache_params")


@lru_cache(maxsize=256)
def _cache_name(forward: Callable) -> str:
    parameters = inspect.signature(forward).parameters
    return next((name for name in CACHE_NAMES if name in parameters), CACHE_NAMES[0])


def cache_kwargs(module: Any, cache: Any) -> dict[str, Any]:
    """{name: cache} for calling `module` (a model or a layer's mixer), under the name its forward takes."""
    return {_cache_name(type(module).forward): cache}


def pop_cache(kwargs: dict[str, Any]) -> Any:
    """The cache a caller passed under any of its names (removed from `kwargs`), or None."""
    found = None
    for name in CACHE_NAMES:
        value = kwargs.pop(name, None)
        found = value if value is not None else found
    return found
