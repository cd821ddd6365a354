"""The names of a shared rollout service's actors in its Ray namespace, and their lookup.

A `RolloutController` built with a namespace names its actors with these; `RolloutController.attach`
(another trainer rank) finds them by the same names. One namespace per run (`shared_service`), so two
runs on one cluster never share actors.
"""

from __future__ import annotations

import time
from typing import Any

import ray

LOOKUP_INTERVAL_S = 0.5

BOARD_NAME = "weight-board"
LEARNER_NAME = "draft-learner"


def worker_name(index: int) -> str:
    """The Ray actor name of rollout worker `index` in a shared service's namespace."""
    return f"rollout-worker-{index}"


def named(name: str, namespace: str | None) -> dict[str, str]:
    """`.options(...)` that name an actor in `namespace` (none without one)."""
    return {} if namespace is None else {"name": name, "namespace": namespace}


def lookup_actor(name: str, namespace: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get_actor(name, namespace=namespace)
        except ValueError as err:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no actor {name!r} in Ray namespace {namespace!r} after {timeout_s}s: "
                                   "the rank that creates the shared rollout service has not started it") from err
            time.sleep(LOOKUP_INTERVAL_S)
