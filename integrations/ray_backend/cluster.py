"""The Ray cluster a specroll job runs on: join the one it was given, or start an embedded one on loopback.

    from .cluster import connect_ray
    where = connect_ray(address=None, num_cpus=3)   # "embedded" or "joined"

Used by every entry point that starts Ray (`specroll train`, `python -m specroll.jobs.ray_job`,
the Ray benchmark), so that all of them get the same security properties:

- **Embedded cluster (no address, no `RAY_ADDRESS`): loopback only.** Ray resolves `127.0.0.1` to the
  machine's routable address (`services.get_node_ip_address`) and its gRPC servers then listen on every
  interface, even with `ray.init(_node_ip_address="127.0.0.1")`. In Ray's single-node mode — the mode
  it uses on macOS and Windows, switched by `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` — the node address
  stays `127.0.0.1` and every process it starts (GCS, raylet, object manager, workers, dashboard and
  runtime-env agents) binds there. The variable is set in this process's environment before
  `ray.init`, so each Ray process it spawns inherits it; the module constant is set too, for a `ray`
  imported before this call. Nothing else on the network can then reach the cluster.
- **Token auth stays on.** Ray 2.60 enables token auth for a new local cluster (`ray.init` writes
  `~/.ray/auth_token` if missing); specroll never sets `RAY_AUTH_MODE`. A user who sets it themselves
  keeps their choice.
- **Joined cluster (an address, or `RAY_ADDRESS` as `ray job submit` sets it):** the cluster's own
  settings apply; with token auth on, the driver reads the token from `~/.ray/auth_token`,
  `RAY_AUTH_TOKEN_PATH` or `RAY_AUTH_TOKEN` (README: Security).
"""

from __future__ import annotations

import os
from typing import Literal

SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTH_MODE_ENV = "RAY_AUTH_MODE"


def connect_ray(address: str | None, num_cpus: int | None, log_to_driver: bool = True
                ) -> Literal["embedded", "joined"]:
    """Join `address` (or `$RAY_ADDRESS`), else start an embedded loopback-only cluster of `num_cpus` CPUs.

    Returns which of the two it did (a no-op returning "joined" when Ray is already initialized here).
    `log_to_driver` False keeps actors' output off this process's terminal (embedded cluster only).
    """
    import ray

    if ray.is_initialized():
        return "joined"
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
        return "joined"
    _single_node()
    # address="local": always a fresh embedded cluster, never another user's on this machine.
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=log_to_driver)
    return "embedded"


def join_embedded(gcs_address: str, auth_mode: str | None) -> None:
    """Join an embedded cluster another process of this machine started (`connect_ray`), as a driver on
    127.0.0.1 too (e.g. rank 1 of a trainer whose rank 0 started the cluster; `shared_service`).

    `auth_mode` is the starting process's `RAY_AUTH_MODE` (Ray sets it to "token" there when it turns
    token auth on for the new cluster): a driver that joins an explicit address sends the token
    (`~/.ray/auth_token`, which that `ray.init` wrote) only in token mode, which Ray turns on here the way
    it does for a new cluster; a mode set in this process already is kept.
    """
    import ray

    if ray.is_initialized():
        return
    if auth_mode == "token" and AUTH_MODE_ENV not in os.environ:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()  # sets RAY_AUTH_MODE=token and refreshes Ray's cached config (already imported)
    _single_node()
    ray.init(address=gcs_address, _node_ip_address="127.0.0.1", log_to_driver=False)


def _single_node() -> None:
    from ray._private import ray_constants

    os.environ[SINGLE_NODE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
