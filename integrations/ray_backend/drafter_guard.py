"""DrafterGuard: on Ray, every worker serves exactly the drafter the learner published — checked, never trusted.

    guard = DrafterGuard(DrafterWatch(), board, wire_dtype=torch.float32, timeout_s=60)
    guard.published(version=3, digest=ray.get(learner.published_digest.remote(torch.float32)))
    guard.verify("drafter publish", workers)        # after a publish, a policy sync, a restart, a resume
    collapsed, stats = guard.judge(batches)         # the first batch after: workers that collapsed (names)

`restarted` tells from a generate call's batches whether Ray restarted a worker since its last batch (each
batch names the worker process that made it). `verify` asks every live worker for the digest of the drafter
its engine serves (`RolloutWorker.drafter_digest`, computed in the worker over the weights as the engine holds
them) and compares it with the learner's (computed on the learner when it published; `published`). A worker
that serves anything else is loaded again from the weight board's payload (its digest checked on arrival); one
still wrong after that is restarted, and reloads both roles from the board; one still wrong after that raises
WeightSyncError. `judge` is the watch's collapse check on the workers' batches (`drafter_watch`); the
controller confirms it with the learner's estimate and reverts. The rules and the events are
`integrations.drafter_watch`'s, as the local backend's (`LocalBackend._verify`, on its one engine).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
import torch

from specroll.integrations.drafter_watch import DrafterWatch

from .sync.protocol import WeightSyncError, wait_for_workers
from .worker import WorkerBatch


class DrafterGuard:
    def __init__(self, watch: DrafterWatch, board: Any, wire_dtype: torch.dtype | None, timeout_s: float):
        self.watch = watch
        self.board = board
        self.wire_dtype = wire_dtype
        self.timeout_s = timeout_s
        self.version: int | None = None  # the learner's published version and its digest, as the learner hashed it
        self.digest: str | None = None
        self.incarnations: dict[int, str] = {}  # worker index → the process its last batch came from

    def published(self, version: int, digest: str) -> None:
        self.version, self.digest = version, digest

    def served(self, workers: dict[str, Any]) -> dict[str, str]:
        """Worker name → the digest of the drafter it serves ("none": a drafter lost where it was held), for each of
        `workers` (name → handle) that is live."""
        live = wait_for_workers(list(workers.values()), self.timeout_s)
        names = [name for handle in live for name, known in workers.items() if known is handle]
        digests = ray.get([w.drafter_digest.remote() for w in live], timeout=self.timeout_s)
        return {name: digest or "none" for name, digest in zip(names, digests)}  # None: what it loaded is gone

    def verify(self, event: str, workers: Sequence[Any]) -> None:
        """Check every live worker serves the published digest after `event`; reload those that do not (an
        event each) and arm the collapse check for the next batch. Raises WeightSyncError when one stays wrong."""
        if self.digest is None:
            return
        by_name = {f"worker {index}": worker for index, worker in enumerate(workers)}
        wrong = self.watch.checked(event, self.served(by_name), self.digest, self.version)
        for step in (self._reload, self._restart):
            if not wrong:
                return
            for name in wrong:
                step(by_name[name])
            served = self.served({name: by_name[name] for name in wrong})
            wrong = sorted(name for name, digest in served.items() if digest != self.digest)
        if wrong:
            raise WeightSyncError(f"after {event}: {', '.join(wrong)} still serve other drafter weights than the "
                                  f"published version {self.version} after a reload and a restart")

    def verify_before_batch(self, workers: Sequence[Any]) -> None:
        """`verify` at a batch's start, recording nothing where every worker serves the published digest (the
        common case): for engines whose drafter lives in another project's code (vLLM), where a sleep, a wake or
        a partial reload can lose it between batches, so a loss is repaired before the batch it would slow."""
        if self.digest is None:
            return
        by_name = {f"worker {index}": worker for index, worker in enumerate(workers)}
        if any(digest != self.digest for digest in self.served(by_name).values()):
            self.verify("batch start", workers)

    def restarted(self, batches: Sequence[WorkerBatch]) -> bool:
        """Whether a batch came from a worker process other than the one its index last answered from (Ray
        restarted it: during this call, or idle since the last one)."""
        seen = {batch.worker_index: batch.incarnation for batch in batches}
        changed = any(self.incarnations.get(index, known) != known for index, known in seen.items())
        self.incarnations.update(seen)
        return changed

    def judge(self, batches: Sequence[WorkerBatch]) -> tuple[list[str], dict[str, Any]]:
        """The collapse check on one generate call's batches: (collapsed worker names, each worker's summed stats)."""
        stats: dict[str, Any] = {}
        for batch in batches:
            name = f"worker {batch.worker_index}"
            stats[name] = stats[name] + batch.stats if name in stats else batch.stats
        return self.watch.judge(stats), stats

    def _reload(self, worker: Any) -> None:
        payload = ray.get(self.board.latest.remote(), timeout=self.timeout_s)["drafter"]
        ray.get(worker.stage_weights.remote("drafter", payload, 0, self.timeout_s), timeout=self.timeout_s + 1.0)
        ray.get(worker.commit_weights.remote("drafter", payload.version), timeout=self.timeout_s)

    def _restart(self, worker: Any) -> None:
        ray.kill(worker, no_restart=False)
        wait_for_workers([worker], self.timeout_s)

