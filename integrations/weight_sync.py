"""Versioned weight sync: named tensors from one sender (trainer or controller) to rollout workers.

Usage (in the controller)::

    transport = make_transport(sync_config)
    buckets, layout = pack_buckets(model.state_dict(), sync_config.bucket_bytes, version=3)
    payload = push_weights(transport, workers, "policy", buckets, layout, timeout_s=60)

Tensors are packed into flat byte buckets (`bucket_bytes` each, several tensors per bucket, any
dtype — bf16 included — carried as raw bytes, so dtypes survive exactly). One protocol,
`WeightTransport`, has two implementations: the Ray object store (default; this module) and a
`torch.distributed` broadcast group (`broadcast_sync.py`). The sender `publish`es the layout (and,
for the object store, the bucket refs), each worker `fetch`es every bucket into staging memory, and
only when all buckets arrived does it copy them into its model and move its version — so a sync that
fails or times out leaves the worker exactly as it was. Every wait is bounded by `timeout_s`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import ray
import torch
from ray.exceptions import GetTimeoutError, RayError

from .config import SyncConfig


class WeightSyncError(RuntimeError):
    """A sync failed or timed out; receivers kept their previous weights and version."""


@dataclass(frozen=True)
class TensorMeta:
    """Where one named tensor lives: bucket index, byte offset and size, original shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class WeightPayload:
    """What every receiver gets: the layout, the version, and transport-specific `route` data
    (the bucket ObjectRefs for the object store; the group address and ranks for a broadcast)."""

    version: int
    metas: tuple[TensorMeta, ...]
    bucket_sizes: tuple[int, ...]
    route: Any = None


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
    from .broadcast_sync import TorchBroadcastTransport

    return TorchBroadcastTransport(backend=config.backend)


def receiving_transport(payload: WeightPayload) -> WeightTransport:
    """The transport a receiver uses for `payload`, told by its route (refs or a broadcast group)."""
    if isinstance(payload.route, tuple):
        return ObjectStoreTransport()
    from .broadcast_sync import TorchBroadcastTransport

    return TorchBroadcastTransport(backend=payload.route.backend)


def push_weights(transport: WeightTransport, workers: Sequence[Any], role: str, buckets: list[torch.Tensor],
                 layout: WeightPayload, timeout_s: float) -> WeightPayload:
    """Send packed weights (`pack_buckets`) for `role` to every worker and wait for all of them.

    Workers expose `receive_weights(role, payload, rank, timeout_s)`. Returns the published payload.
    Raises WeightSyncError if any worker failed or the sync ran past `timeout_s` (+1 s of slack for
    the workers' own bounded fetches to report).
    """
    started = time.perf_counter()
    payload = transport.publish(buckets, layout, len(workers))
    acks = [w.receive_weights.remote(role, payload, rank + 1, timeout_s) for rank, w in enumerate(workers)]
    try:
        transport.stream(buckets, payload, timeout_s)
        ray.get(acks, timeout=max(0.0, timeout_s - (time.perf_counter() - started)) + 1.0)
    except GetTimeoutError as err:  # each worker bounds its own fetch by timeout_s, so none lingers
        raise WeightSyncError(f"{role} sync to version {layout.version} timed out after {timeout_s}s") from err
    except RayError as err:
        raise WeightSyncError(f"{role} sync to version {layout.version} failed: {err}") from err
    return payload
