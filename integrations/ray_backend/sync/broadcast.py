"""The `torch.distributed` weight transport: the sender broadcasts byte buckets to every worker.

Gloo on CPU, NCCL on GPU. Each sync forms a fresh, stateless group (sender = rank 0, worker i =
rank i + 1) from a `TCPStore` the sender hosts, and tears it down afterwards. That costs one
rendezvous per sync, and buys what a long-lived group cannot give: a worker that died and restarted,
or a sync that timed out, leaves no half-broken communicator behind for the next sync to hang on.
Every step — rendezvous, each bucket's broadcast — waits at most `timeout_s` (the failure this
guards against: a public framework that blocked forever on a dead NCCL peer). The group is built
without `init_process_group`, so a trainer's own default group is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import ray
import torch
import torch.distributed as dist

from .protocol import WeightPayload, WeightSyncError


@dataclass(frozen=True)
class BroadcastRoute:
    """Where receivers find the group: the sender's store address and the group size."""

    host: str
    port: int
    world_size: int
    backend: str


class TorchBroadcastTransport:
    """Broadcasts each bucket from rank 0; receivers allocate and receive into staging buckets."""

    def __init__(self, backend: str = "gloo"):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={backend!r} is invalid: 'gloo' or 'nccl'")
        self.backend = backend
        self._store: dist.TCPStore | None = None

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def publish(self, buckets: list[torch.Tensor], payload: WeightPayload, num_receivers: int) -> WeightPayload:
        host = ray.util.get_node_ip_address()
        self._store = dist.TCPStore(host, 0, num_receivers + 1, is_master=True,
                                    timeout=timedelta(seconds=30), wait_for_workers=False)
        route = BroadcastRoute(host, self._store.port, num_receivers + 1, self.backend)
        return WeightPayload(payload.version, payload.metas, payload.bucket_sizes, route=route)

    def stream(self, buckets: list[torch.Tensor], payload: WeightPayload, timeout_s: float) -> None:
        try:
            group = self._join(payload, 0, timeout_s)
            for bucket in buckets:
                self._broadcast(group, bucket.to(self.device), timeout_s)
        finally:
            self._store = None

    def fetch(self, payload: WeightPayload, rank: int, timeout_s: float) -> list[torch.Tensor]:
        group = self._join(payload, rank, timeout_s)
        buckets = []
        for size in payload.bucket_sizes:
            bucket = torch.empty(size, dtype=torch.uint8, device=self.device)  # [nbytes]
            self._broadcast(group, bucket, timeout_s)
            buckets.append(bucket.cpu())
        return buckets

    def _join(self, payload: WeightPayload, rank: int, timeout_s: float) -> dist.ProcessGroup:
        route: BroadcastRoute = payload.route
        timeout = timedelta(seconds=timeout_s)
        try:
            store = self._store if rank == 0 else dist.TCPStore(
                route.host, route.port, route.world_size, is_master=False, timeout=timeout)
            store = dist.PrefixStore(f"v{payload.version}", store)
            if self.backend == "gloo":
                return dist.ProcessGroupGloo(store, rank, route.world_size, timeout)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            return dist.ProcessGroupNCCL(store, rank, route.world_size, options)
        except (RuntimeError, dist.DistError) as err:
            raise WeightSyncError(f"rank {rank} could not join the {self.backend} group for version "
                                  f"{payload.version} within {timeout_s}s: {err}") from err

    def _broadcast(self, group: dist.ProcessGroup, bucket: torch.Tensor, timeout_s: float) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.rootTensor = 0
        try:
            group.broadcast([bucket], options).wait(timedelta(seconds=timeout_s))
        except (RuntimeError, dist.DistError) as err:
            raise WeightSyncError(f"{self.backend} broadcast did not complete within {timeout_s}s: {err}") from err
