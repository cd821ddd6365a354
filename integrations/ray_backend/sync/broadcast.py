"""The `torch.distributed` weight transport: one persistent broadcast group, the sender at rank 0.

Gloo on CPU, NCCL on GPU. The sender (`TorchBroadcastTransport`, in the controller) forms the group at
its first sync — a `TCPStore` it hosts, worker i at rank i + 1, each worker's side a `GroupMember` — and
every later sync reuses it: no rendezvous and no communicator setup per sync. It is formed again only
when the workers it must reach changed: one restarted (its new process holds no group), Ray gave one up,
or a sync failed midway (each side drops a group an operation failed on: a half-done broadcast leaves it
out of step). `open` asks every worker which group it holds, one round trip per sync. `close` (the
controller's shutdown) shuts the group down on the workers and on the sender.

The sender builds each bucket on the group's device in the wire dtype (`PackedBuckets.build`) while the
previous one is on the wire, so it holds two buckets at a time; receivers allocate theirs on their
device and keep them staged (on a GPU nothing goes through host memory). Every step — forming the
group, each bucket's broadcast — waits at most `timeout_s` (the failure this guards against: a public
framework that blocked forever on a dead NCCL peer). The group is built without `init_process_group`,
so a trainer's own default group is never touched; gloo binds the node's Ray address.

The weight board gets a `PeerRoute`: the workers that staged the version export it to one that restarts.
A lone worker has no peer, so its buckets go to the object store for the board as well.
"""

from __future__ import annotations

import dataclasses
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist
from ray.exceptions import RayError

from .payload import PeerRoute
from .protocol import ObjectStoreTransport, PackedBuckets, WeightPayload, WeightSyncError


@dataclass(frozen=True)
class BroadcastRoute:
    """Where receivers find the group: its id, the sender's store address and the group size."""

    group_id: str
    host: str
    port: int
    world_size: int
    backend: str


def group_device(backend: str) -> torch.device:
    """Where a group's buckets live: the current GPU for NCCL, the CPU for gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


class TorchBroadcastTransport:
    """The sender's side: forms the group on the live workers (`open`) and broadcasts each bucket from rank 0."""

    def __init__(self, backend: str = "gloo"):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={backend!r} is invalid: 'gloo' or 'nccl'")
        self.backend = backend
        self.route: BroadcastRoute | None = None
        self.members: list[Any] = []  # worker handles; members[i] is rank i + 1
        self.num_groups_formed = 0
        self._group: dist.ProcessGroup | None = None
        self._store: dist.TCPStore | None = None

    @property
    def device(self) -> torch.device:
        return group_device(self.backend)

    def open(self, workers: Sequence[Any], timeout_s: float) -> None:
        if self._group is not None and list(workers) == self.members and self._members_hold_group(timeout_s):
            return
        self.close(timeout_s)
        self._form(list(workers), timeout_s)

    def publish(self, buckets: PackedBuckets, payload: WeightPayload, num_receivers: int) -> WeightPayload:
        if self.route is None or num_receivers != len(self.members):
            raise WeightSyncError(f"publish to {num_receivers} receivers before open() formed a group over them")
        return dataclasses.replace(payload, route=self.route)

    def stream(self, buckets: PackedBuckets, payload: WeightPayload, timeout_s: float) -> None:
        try:
            _bound(self._group, timeout_s)
            bucket = buckets.build(0, self.device) if len(buckets) else None
            for index in range(len(buckets)):
                work = _start_broadcast(self._group, bucket)
                following = buckets.build(index + 1, self.device) if index + 1 < len(buckets) else None
                _wait(work, self.backend, timeout_s)
                bucket = following
            _settle(self.device)
        except WeightSyncError:
            self._shut_down_own()  # out of step with the workers: `open` forms a new group next time
            raise

    def board_payload(self, buckets: PackedBuckets, payload: WeightPayload,
                      holders: Sequence[tuple[int, Any]]) -> WeightPayload:
        if len(holders) < 2:
            return ObjectStoreTransport().publish(buckets, payload, len(holders))
        route = PeerRoute(ray.put(tuple(holders)))
        return dataclasses.replace(payload, route=route)

    def close(self, timeout_s: float) -> None:
        """Shut the group down on every member (bounded by `timeout_s`; a dead one has none) and here."""
        if self.members:
            left = [w.leave_sync_group.remote() for w in self.members]
            try:
                ray.get(left, timeout=timeout_s)
            except RayError as err:  # a worker that is gone or stuck holds no usable group either
                warnings.warn(f"a rollout worker did not leave the {self.backend} broadcast group: {err}",
                              stacklevel=2)
        self.members, self.route = [], None
        self._shut_down_own()

    def _form(self, workers: list[Any], timeout_s: float) -> None:
        host = ray.util.get_node_ip_address()
        store = dist.TCPStore(host, 0, len(workers) + 1, is_master=True, timeout=timedelta(seconds=timeout_s),
                              wait_for_workers=False)
        route = BroadcastRoute(uuid.uuid4().hex, host, store.port, len(workers) + 1, self.backend)
        joined = [w.join_sync_group.remote(route, rank + 1, timeout_s) for rank, w in enumerate(workers)]
        try:
            group = form_group(route, 0, timeout_s, store)
            ray.get(joined, timeout=timeout_s + 1.0)
        except (RayError, WeightSyncError) as err:
            for worker in workers:
                worker.leave_sync_group.remote()
            raise WeightSyncError(f"the {self.backend} broadcast group over {len(workers)} workers could not "
                                  f"be formed within {timeout_s}s: {err}") from err
        self._store, self._group, self.route, self.members = store, group, route, workers
        self.num_groups_formed += 1

    def _members_hold_group(self, timeout_s: float) -> bool:
        try:
            held = ray.get([w.sync_group.remote() for w in self.members], timeout=timeout_s)
        except RayError:
            return False
        return all(group_id == self.route.group_id for group_id in held)

    def _shut_down_own(self) -> None:
        if self._group is not None:
            self._group.shutdown()
        self._group, self._store = None, None


class GroupMember:
    """A worker's side of the sender's group: joined once, received on by every sync, left on close."""

    def __init__(self) -> None:
        self.route: BroadcastRoute | None = None
        self.rank = 0
        self._group: dist.ProcessGroup | None = None

    @property
    def group_id(self) -> str | None:
        return None if self.route is None else self.route.group_id

    def join(self, route: BroadcastRoute, rank: int, timeout_s: float) -> None:
        self.leave()
        self._group = form_group(route, rank, timeout_s)
        self.route, self.rank = route, rank

    def leave(self) -> None:
        if self._group is not None:
            self._group.shutdown()
        self._group, self.route = None, None

    def fetch(self, payload: WeightPayload, rank: int, timeout_s: float) -> list[torch.Tensor]:
        """Every bucket of `payload` on the group's device; raises WeightSyncError (and leaves a group the
        failure put out of step) if this worker is not `rank` of the payload's group or a bucket is late."""
        route: BroadcastRoute = payload.route
        if self._group is None or route.group_id != self.group_id or rank != self.rank:
            raise WeightSyncError(f"not rank {rank} of broadcast group {route.group_id} (holds group "
                                  f"{self.group_id}, rank {self.rank})")
        device = group_device(route.backend)
        buckets = [torch.empty(size, dtype=torch.uint8, device=device) for size in payload.bucket_sizes]  # [nbytes]
        try:
            _bound(self._group, timeout_s)
            works = [_start_broadcast(self._group, bucket) for bucket in buckets]
            for work in works:
                _wait(work, route.backend, timeout_s)
            _settle(device)
        except WeightSyncError:
            self.leave()
            raise
        return buckets


def form_group(route: BroadcastRoute, rank: int, timeout_s: float,
               store: dist.Store | None = None) -> dist.ProcessGroup:
    """Join `route`'s group as `rank` (rank 0 passes the store it hosts); returns once every rank has joined."""
    timeout = timedelta(seconds=timeout_s)
    try:
        if store is None:
            store = dist.TCPStore(route.host, route.port, route.world_size, is_master=False, timeout=timeout)
        prefixed = dist.PrefixStore(route.group_id, store)
        if route.backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=ray.util.get_node_ip_address())]
            group = dist.ProcessGroupGloo(prefixed, rank, route.world_size, options)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            group = dist.ProcessGroupNCCL(prefixed, rank, route.world_size, options)
        hello = torch.zeros(1, dtype=torch.uint8, device=group_device(route.backend))  # [1]: every rank is here
        _wait(_start_broadcast(group, hello), route.backend, timeout_s)
        _settle(hello.device)
    except (RuntimeError, dist.DistError) as err:
        raise WeightSyncError(f"rank {rank} could not join {route.backend} broadcast group {route.group_id} "
                              f"within {timeout_s}s: {err}") from err
    return group


def _bound(group: dist.ProcessGroup, timeout_s: float) -> None:
    """Bound the group's next operations by this sync's `timeout_s` (gloo takes an operation's timeout from
    the group, not from `Work.wait`; the group was formed with the first sync's)."""
    group._set_default_timeout(timedelta(seconds=timeout_s))


def _start_broadcast(group: dist.ProcessGroup, bucket: torch.Tensor) -> dist.Work:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    options.rootTensor = 0
    return group.broadcast([bucket], options)


def _wait(work: dist.Work, backend: str, timeout_s: float) -> None:
    try:
        work.wait(timedelta(seconds=timeout_s))
    except (RuntimeError, dist.DistError) as err:
        raise WeightSyncError(f"{backend} broadcast did not complete within {timeout_s}s: {err}") from err


def _settle(device: torch.device) -> None:
    """On a GPU `Work.wait` only orders the current stream after NCCL's: wait for the bytes themselves, so a
    staged version has arrived (and a sent one left) when this returns. The NCCL watchdog bounds it."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
