"""Versioned weight sync: named tensors from one sender (trainer or controller) to rollout workers.

Usage (in the controller; `RolloutController._sync` is the full sequence)::

    transport = make_transport(sync_config)
    workers = wait_for_workers(workers, timeout_s=60)
    buckets, layout = pack_buckets(model.state_dict(), sync_config.bucket_bytes, version=3)
    payload = stage_weights(transport, workers, "policy", buckets, layout, timeout_s=60)
    board.post.remote("policy", payload)  # the commit point
    commit_weights(workers, "policy", payload, timeout_s=60)

Tensors are packed into flat byte buckets (`bucket_bytes` each, several tensors per bucket, any
dtype — bf16 included — carried as raw bytes, so dtypes survive exactly). One protocol,
`WeightTransport`, has two implementations: the Ray object store (default; this module) and a
`torch.distributed` broadcast group (`broadcast_sync.py`). The sender `publish`es the layout (and,
for the object store, the bucket refs), each worker `fetch`es every bucket into staging memory.

A sync is all-or-nothing across workers, in two phases around a commit point. First every worker
that Ray is restarting is waited for, and every worker stages the new version (fetched and checked
to fit, nothing served changes); a failure here makes every worker drop what it staged, so all keep
serving the old version. Then the controller posts the version on the `WeightBoard` — the commit
point: a worker that restarts from then on loads it in `__init__` — and every worker commits it; one
that lost its staged copy (it restarted in between) is staged again from the board's payload. Every
wait is bounded by `timeout_s`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import ray
import torch
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError

from ..settings import SyncConfig
from .payload import TensorMeta, WeightPayload

RESTART_PROBE_INTERVAL_S = 0.2  # how often a worker Ray is restarting is asked again whether it is up


class WeightSyncError(RuntimeError):
    """A sync failed or timed out; receivers kept their previous weights and version."""


class WeightTransport(Protocol):
    """Moves byte buckets from the sender to the receivers; `publish`/`fetch` are an honest pair."""

    def publish(self, buckets: list[torch.Tensor], payload: WeightPayload, num_receivers: int) -> WeightPayload:
        """Sender, before receivers are called: make the buckets reachable; returns the payload to send."""
        ...

    def stream(self, buckets: list[torch.Tensor], payload: WeightPayload, timeout_s: float) -> None:
        """Sender, while receivers fetch (a broadcast pushes here; the object store has nothing to do)."""
        ...

    def fetch(self, payload: WeightPayload, rank: int, timeout_s: float) -> list[torch.Tensor]:
        """Receiver: every bucket of `payload` as a uint8 tensor; raises WeightSyncError on failure."""
        ...


def pack_buckets(named_tensors: Mapping[str, torch.Tensor], bucket_bytes: int,
                 version: int) -> tuple[list[torch.Tensor], WeightPayload]:
    """Flatten tensors into uint8 buckets of about `bucket_bytes` (a larger tensor gets its own)."""
    metas, buckets, current, used = [], [], [], 0
    for name, tensor in named_tensors.items():
        raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)  # [nbytes]
        if current and used + raw.numel() > bucket_bytes:
            buckets.append(torch.cat(current))
            current, used = [], 0
        metas.append(TensorMeta(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."),
                                len(buckets), used, raw.numel()))
        current.append(raw)
        used += raw.numel()
    if current:
        buckets.append(torch.cat(current))
    payload = WeightPayload(version, tuple(metas), tuple(int(b.numel()) for b in buckets))
    return buckets, payload


def unpack_buckets(payload: WeightPayload, buckets: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Views into `buckets` with each tensor's original name, shape and dtype (no copy)."""
    if [int(b.numel()) for b in buckets] != list(payload.bucket_sizes):
        raise WeightSyncError(f"bucket sizes {[b.numel() for b in buckets]} != {list(payload.bucket_sizes)}")
    out = {}
    for meta in payload.metas:
        raw = buckets[meta.bucket][meta.offset : meta.offset + meta.nbytes]
        out[meta.name] = raw.view(getattr(torch, meta.dtype)).reshape(meta.shape)
    return out


class ObjectStoreTransport:
    """Buckets go through Ray's object store as numpy uint8 arrays (zero-copy reads on each node)."""

    def publish(self, buckets: list[torch.Tensor], payload: WeightPayload, num_receivers: int) -> WeightPayload:
        refs = tuple(ray.put(bucket.numpy()) for bucket in buckets)
        return WeightPayload(payload.version, payload.metas, payload.bucket_sizes, route=refs)

    def stream(self, buckets: list[torch.Tensor], payload: WeightPayload, timeout_s: float) -> None:
        return None

    def fetch(self, payload: WeightPayload, rank: int, timeout_s: float) -> list[torch.Tensor]:
        try:
            arrays = ray.get(list(payload.route), timeout=timeout_s)
        except GetTimeoutError as err:
            raise WeightSyncError(f"object-store fetch of version {payload.version} timed out "
                                  f"after {timeout_s}s") from err
        except RayError as err:
            raise WeightSyncError(f"object-store fetch of version {payload.version} failed: {err}") from err
        with warnings.catch_warnings():  # store arrays are read-only; we only read them before copying
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return [torch.from_numpy(array) for array in arrays]


def make_transport(config: SyncConfig) -> WeightTransport:
    """The transport named by `config.transport`."""
    if config.transport == "object_store":
        return ObjectStoreTransport()
    from .broadcast import TorchBroadcastTransport

    return TorchBroadcastTransport(backend=config.backend)


def receiving_transport(payload: WeightPayload) -> WeightTransport:
    """The transport a receiver uses for `payload`, told by its route (refs or a broadcast group)."""
    if isinstance(payload.route, tuple):
        return ObjectStoreTransport()
    from .broadcast import TorchBroadcastTransport

    return TorchBroadcastTransport(backend=payload.route.backend)


def wait_for_workers(workers: Sequence[Any], timeout_s: float) -> list[Any]:
    """The workers that answer, waiting up to `timeout_s` for those Ray is restarting.

    A worker Ray will not restart any more (its `max_restarts` are spent: it can serve nothing) is left
    out with a warning.
    Raises WeightSyncError naming `timeout_s` when a worker is still restarting after it, or when no
    worker is left.
    """
    deadline = time.monotonic() + timeout_s
    live = [w for index, w in enumerate(workers) if _wait_alive(w, index, deadline, timeout_s)]
    if not live:
        raise WeightSyncError(f"none of the {len(workers)} rollout workers is alive")
    return live


def stage_weights(transport: WeightTransport, workers: Sequence[Any], role: str, buckets: list[torch.Tensor],
                  layout: WeightPayload, timeout_s: float) -> WeightPayload:
    """Send packed weights (`pack_buckets`) for `role` to every worker's staging memory; returns the
    published payload. Nothing a worker serves changes until `commit_weights`.

    Raises WeightSyncError if any worker failed or the staging ran past `timeout_s` (+1 s of slack for
    the workers' own bounded fetches to report); the workers then drop what they staged.
    """
    started = time.perf_counter()
    payload = transport.publish(buckets, layout, len(workers))
    acks = [w.stage_weights.remote(role, payload, rank + 1, timeout_s) for rank, w in enumerate(workers)]
    try:
        transport.stream(buckets, payload, timeout_s)
        ray.get(acks, timeout=max(0.0, timeout_s - (time.perf_counter() - started)) + 1.0)
    except (RayError, WeightSyncError) as err:  # each worker bounds its own fetch by timeout_s, so none lingers
        discard_staged(workers, role)
        reason = f"timed out after {timeout_s}s" if isinstance(err, GetTimeoutError) else f"failed: {err}"
        raise WeightSyncError(f"{role} sync to version {layout.version} {reason}") from err
    return payload


def discard_staged(workers: Sequence[Any], role: str) -> None:
    """Ask every worker to drop its staged `role` weights (not awaited: a dead worker has none)."""
    for worker in workers:
        worker.discard_staged.remote(role)


def commit_weights(workers: Sequence[Any], role: str, payload: WeightPayload, timeout_s: float) -> None:
    """Load the staged `payload.version` on every worker, once it is posted on the weight board.

    A worker whose commit fails or does not answer within `timeout_s` (it restarted since staging, or
    is restarting) is waited for and staged again from `payload`, which must be the board's
    object-store payload; one that still fails within another `timeout_s` is restarted, so that it
    reloads the board's version before it serves again. Never raises: the version is committed.
    """
    acks = {w.commit_weights.remote(role, payload.version): (index, w) for index, w in enumerate(workers)}
    ready, _ = ray.wait(list(acks), num_returns=len(acks), timeout=timeout_s)
    failed = [(index, worker) for ack, (index, worker) in acks.items() if ack not in ready or _raised(ack)]
    deadline = time.monotonic() + timeout_s
    for index, worker in failed:
        _stage_and_commit_again(worker, index, role, payload, deadline, timeout_s)


def _stage_and_commit_again(worker: Any, index: int, role: str, payload: WeightPayload, deadline: float,
                            timeout_s: float) -> None:
    try:
        if _wait_alive(worker, index, deadline, timeout_s):
            ray.get(worker.stage_weights.remote(role, payload, 0, _left(deadline)), timeout=_left(deadline) + 1.0)
            ray.get(worker.commit_weights.remote(role, payload.version), timeout=_left(deadline))
    except (RayError, WeightSyncError) as err:
        warnings.warn(f"rollout worker {index} could not load committed {role} version {payload.version} "
                      f"({err}); restarting it so that it loads that version from the weight board", stacklevel=3)
        ray.kill(worker, no_restart=False)


def _raised(ref: ray.ObjectRef) -> bool:
    try:
        ray.get(ref)
    except RayError:
        return True
    return False


def _wait_alive(worker: Any, index: int, deadline: float, timeout_s: float) -> bool:
    """True once `worker` answers; False when Ray has given it up; WeightSyncError past `deadline`."""
    died_once = False
    while True:
        try:
            ray.get(worker.versions.remote(), timeout=_left(deadline))
            return True
        except GetTimeoutError as err:
            raise WeightSyncError(f"rollout worker {index} did not answer within {timeout_s}s") from err
        except ActorUnavailableError:  # restarting
            died_once = False
        except RayActorError:
            # A call running when the worker died fails like this even if Ray restarts the worker: it
            # has been given up only if a later call fails the same way.
            if died_once:
                warnings.warn(f"rollout worker {index} is dead and Ray will not restart it; "
                              "syncing the others", stacklevel=3)
                return False
            died_once = True
        if time.monotonic() + RESTART_PROBE_INTERVAL_S > deadline:
            raise WeightSyncError(f"rollout worker {index} still restarting after {timeout_s}s")
        time.sleep(RESTART_PROBE_INTERVAL_S)


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
