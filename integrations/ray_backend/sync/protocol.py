"""Versioned weight sync: named tensors from one sender (trainer or controller) to rollout workers.

Usage (in the controller; `sequence.sync_weights` is the full sequence; `transports.make_transport`)::

    transport = make_transport(sync_config)
    workers = wait_for_workers(workers, timeout_s=60)
    buckets, layout = pack_buckets(model.state_dict(), sync_config.bucket_bytes, version=3, wire_dtype=torch.bfloat16)
    payload = stage_weights(transport, workers, "policy", buckets, layout, timeout_s=60)
    board.post.remote("policy", payload)  # the commit point
    commit_weights(workers, "policy", payload, timeout_s=60)
    ...
    transport.close(timeout_s=60)  # at shutdown: the broadcast group is left on every worker

Tensors are packed into flat byte buckets (`bucket_bytes` each, several tensors per bucket, 16-byte
aligned, any dtype — bf16 included — carried as raw bytes, so dtypes survive exactly). Floating tensors
travel in the wire dtype (the engine's: an fp32 trainer sends a bf16 engine half the bytes, rounded as the
engine's own copy would round them), except the buffers the engine keeps in fp32. `pack_buckets` only
plans: each bucket is built when a transport asks for it, on the transport's device (a GPU for NCCL), so
a sender holds one or two buckets, not the whole payload, and never goes through host memory on a GPU.

One protocol, `WeightTransport`, has two implementations: the Ray object store (default; this module)
and a persistent `torch.distributed` broadcast group (`broadcast`). The sender `open`s it on the live
workers, `publish`es the layout (and, for the object store, the bucket refs) and `stream`s; each
worker fetches every bucket into staging memory (on its device: a receiver on the sender's device kind
copies device to device). `board_payload` is what the `WeightBoard` keeps for workers that restart:
the object store's refs, or for the broadcast the workers that hold the version (`PeerRoute`).

A sync is all-or-nothing across workers, in two phases around a commit point. First every worker
that Ray is restarting is waited for, and every worker stages the new version (fetched and checked
to fit, nothing served changes); a failure here makes every worker drop what it staged, so all keep
serving the old version. Then the controller posts the version on the `WeightBoard` — the commit
point: a worker that restarts from then on loads it in `__init__` — and every worker commits it; one
that lost its staged copy (it restarted in between) is staged again from the board's payload. Every
wait is bounded by `timeout_s`.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import ray
import torch
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError

from specroll.rollout.models.weights import FP32_BUFFER_SUFFIXES

from .payload import TensorMeta, WeightPayload

RESTART_PROBE_INTERVAL_S = 0.2  # how often a worker Ray is restarting is asked again whether it is up
ALIGN_BYTES = 16  # every tensor starts at a multiple of this, so a bucket slice views as any dtype


class WeightSyncError(RuntimeError):
    """A sync failed or timed out; receivers kept their previous weights and version."""


@dataclass(frozen=True)
class PackedBuckets:
    """The sender's buckets, planned but not built: `build(i, device)` makes bucket i, one copy per tensor
    (cast to the wire dtype on the way). Indexing and iterating build on the CPU."""

    sources: tuple[tuple[tuple[TensorMeta, torch.Tensor], ...], ...]  # per bucket: (place, source tensor)
    sizes: tuple[int, ...]

    def build(self, index: int, device: torch.device | str) -> torch.Tensor:
        bucket = torch.empty(self.sizes[index], dtype=torch.uint8, device=device)  # [nbytes]
        with torch.no_grad():
            for meta, tensor in self.sources[index]:
                view = bucket[meta.offset : meta.offset + meta.nbytes].view(getattr(torch, meta.dtype))
                view.view(meta.shape).copy_(tensor.detach())
        return bucket

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.build(index, "cpu")

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self.build(index, "cpu") for index in range(len(self)))


class WeightTransport(Protocol):
    """Moves byte buckets from the sender to the receivers. `open`/`close` bracket the transport's
    life on a set of workers; `publish`, `stream` and the workers' fetch make one sync."""

    def open(self, workers: Sequence[Any], timeout_s: float) -> None:
        """Sender, before each sync: make the transport reach exactly `workers` (a no-op once it does)."""
        ...

    def publish(self, buckets: PackedBuckets, payload: WeightPayload, num_receivers: int) -> WeightPayload:
        """Sender, before receivers are called: make the buckets reachable; returns the payload to send."""
        ...

    def stream(self, buckets: PackedBuckets, payload: WeightPayload, timeout_s: float) -> None:
        """Sender, while receivers fetch (a broadcast pushes here; the object store has nothing to do)."""
        ...

    def board_payload(self, buckets: PackedBuckets, payload: WeightPayload,
                      holders: Sequence[tuple[int, Any]]) -> WeightPayload:
        """What the weight board keeps of a version staged on `holders` (worker index, handle), for workers
        that restart."""
        ...

    def close(self, timeout_s: float) -> None:
        """Sender, at shutdown: release what `open` built, on the workers too."""
        ...


def pack_buckets(named_tensors: Mapping[str, torch.Tensor], bucket_bytes: int, version: int,
                 wire_dtype: torch.dtype | None = None) -> tuple[PackedBuckets, WeightPayload]:
    """Plan uint8 buckets of about `bucket_bytes` (a larger tensor gets its own); nothing is copied yet.

    With `wire_dtype`, floating tensors travel in it, except buffers named `FP32_BUFFER_SUFFIXES` (kept fp32).
    """
    metas, sources, current, used = [], [], [], 0
    for name, tensor in named_tensors.items():
        dtype = tensor.dtype
        if wire_dtype is not None and dtype.is_floating_point and not name.endswith(FP32_BUFFER_SUFFIXES):
            dtype = wire_dtype
        nbytes = tensor.numel() * dtype.itemsize
        offset = -(-used // ALIGN_BYTES) * ALIGN_BYTES
        if current and offset + nbytes > bucket_bytes:
            sources.append(tuple(current))
            current, offset = [], 0
        meta = TensorMeta(name, tuple(tensor.shape), str(dtype).removeprefix("torch."), len(sources), offset, nbytes)
        metas.append(meta)
        current.append((meta, tensor))
        used = offset + nbytes
    if current:
        sources.append(tuple(current))
    sizes = tuple(group[-1][0].offset + group[-1][0].nbytes for group in sources)
    return PackedBuckets(tuple(sources), sizes), WeightPayload(version, tuple(metas), sizes)


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
    """Buckets go through Ray's object store as numpy uint8 arrays (zero-copy reads on each node); each is
    built on the CPU, put, and dropped, so the sender holds one at a time."""

    def open(self, workers: Sequence[Any], timeout_s: float) -> None:
        return None

    def publish(self, buckets: PackedBuckets, payload: WeightPayload, num_receivers: int) -> WeightPayload:
        refs = tuple(ray.put(bucket.numpy()) for bucket in buckets)
        return dataclasses.replace(payload, route=refs)

    def stream(self, buckets: PackedBuckets, payload: WeightPayload, timeout_s: float) -> None:
        return None

    def board_payload(self, buckets: PackedBuckets, payload: WeightPayload,
                      holders: Sequence[tuple[int, Any]]) -> WeightPayload:
        return payload

    def close(self, timeout_s: float) -> None:
        return None


def fetch_from_object_store(payload: WeightPayload, timeout_s: float) -> list[torch.Tensor]:
    """Receiver: the buckets of an object-store payload, read in place from the store (read-only)."""
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


def stage_weights(transport: WeightTransport, workers: Sequence[Any], role: str, buckets: PackedBuckets,
                  layout: WeightPayload, timeout_s: float) -> WeightPayload:
    """Send packed weights (`pack_buckets`) for `role` to every worker's staging memory; returns what the
    weight board keeps of them (`WeightTransport.board_payload`: post it, then `commit_weights` it).
    Nothing a worker serves changes until `commit_weights`.

    Raises WeightSyncError if any worker failed or the staging ran past `timeout_s` (+1 s of slack for
    the workers' own bounded fetches to report); the workers then drop what they staged.
    """
    started = time.perf_counter()
    try:
        transport.open(workers, timeout_s)
        payload = transport.publish(buckets, layout, len(workers))
        acks = [w.stage_weights.remote(role, payload, rank + 1, timeout_s) for rank, w in enumerate(workers)]
        transport.stream(buckets, payload, timeout_s)
        indices = ray.get(acks, timeout=max(0.0, timeout_s - (time.perf_counter() - started)) + 1.0)
    except (RayError, WeightSyncError) as err:  # each worker bounds its own fetch by timeout_s, so none lingers
        discard_staged(workers, role)
        reason = f"timed out after {timeout_s}s" if isinstance(err, GetTimeoutError) else f"failed: {err}"
        raise WeightSyncError(f"{role} sync to version {layout.version} {reason}") from err
    return transport.board_payload(buckets, payload, list(zip(indices, workers)))


def discard_staged(workers: Sequence[Any], role: str) -> None:
    """Ask every worker to drop its staged `role` weights (not awaited: a dead worker has none)."""
    for worker in workers:
        worker.discard_staged.remote(role)


def commit_weights(workers: Sequence[Any], role: str, payload: WeightPayload, timeout_s: float) -> None:
    """Load the staged `payload.version` on every worker, once it is posted on the weight board.

    A worker whose commit fails or does not answer within `timeout_s` (it restarted since staging, or
    is restarting) is waited for and staged again from `payload`, which must be the board's payload
    (`stage_weights` returns it); one that still fails within another `timeout_s` is restarted, so that it
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
