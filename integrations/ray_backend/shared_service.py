"""One Ray rollout service for all ranks of a multi-process trainer (`accelerate launch`, `torchrun`).

    controller = shared_controller(config, ranks)   # every rank calls this, with the same config

The main rank joins the Ray cluster (the given address, `$RAY_ADDRESS`, or a fresh embedded
loopback cluster), picks a run namespace and creates the controller's workers, weight board and
learner as named actors there; it then broadcasts the namespace and the cluster's address, which
every other rank waits for, so no rank looks the actors up before they exist. The other ranks join
that cluster (an embedded one is loopback-only, so they run on the same machine) and attach to the
actors (`RolloutController.attach`). The actors belong to the main rank's driver: they stop with it,
and two runs on one cluster never share them.

`RankGroup` is what this needs from the trainer's process group; `trl_hook.ranks.AccelerateRanks`
implements it with accelerate's.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .settings import ControllerConfig


class RankGroup(Protocol):
    """The trainer's processes: which one is main, and a broadcast from it that the others wait for."""

    @property
    def is_main(self) -> bool: ...

    def broadcast(self, value: Any) -> Any:
        """The main rank's `value` on every rank (blocks until the main rank sends it)."""
        ...


@dataclass(frozen=True)
class ServiceAddress:
    """Where the other ranks find the service: the Ray GCS address, whether the main rank started that
    cluster itself (then it binds to 127.0.0.1 only, and `auth_mode` is the token auth Ray set up for
    it), and the run's namespace."""

    gcs_address: str
    embedded: bool
    namespace: str
    auth_mode: str | None = None


def shared_controller(config: ControllerConfig, ranks: RankGroup,
                      connect: Callable[[], Literal["embedded", "joined"]] | None = None,
                      timeout_s: float = 120.0) -> Any:
    """The run's one `RolloutController`: created on the main rank, attached on the others (see module doc).

    `connect` puts the main rank on a Ray cluster and says which kind (default: `connect_ray` with
    `$RAY_ADDRESS` or an embedded cluster); `timeout_s` bounds the actor lookup on the other ranks.
    """
    import ray

    from .cluster import AUTH_MODE_ENV, connect_ray, join_embedded
    from .controller import RolloutController

    service = None
    controller = None
    if ranks.is_main:
        embedded = (connect or (lambda: connect_ray(None, None, log_to_driver=False)))() == "embedded"
        namespace = f"specroll-{uuid.uuid4().hex[:12]}"
        controller = RolloutController(config, namespace=namespace)
        service = ServiceAddress(ray.get_runtime_context().gcs_address, embedded, namespace,
                                 os.environ.get(AUTH_MODE_ENV))
    service = ranks.broadcast(service)
    if controller is not None:
        return controller
    if service.embedded:
        join_embedded(service.gcs_address, service.auth_mode)
    else:
        connect_ray(service.gcs_address, None)
    return RolloutController.attach(config, service.namespace, timeout_s)
