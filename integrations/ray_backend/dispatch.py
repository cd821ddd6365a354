"""Fault-tolerant dispatch of prompt chunks to rollout workers: every chunk runs exactly once.

`split_groups` cuts a call's prompts into contiguous chunks, at most one per worker (whole GRPO
groups: a prompt's n samples stay on one engine). `run_chunks` hands chunks to idle workers and
re-sends a chunk whose worker died — to the restarted worker or another idle one — keeping each
chunk's result exactly once, so every prompt gets exactly n completions (`RolloutController.generate`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from specroll.rollout import SamplingParams

from .sync.protocol import RESTART_PROBE_INTERVAL_S
from .worker import WorkerBatch


def split_groups(num_prompts: int, num_workers: int) -> list[range]:
    """Contiguous, near-equal ranges of prompt indices, at most one per worker, none empty."""
    num_chunks = max(1, min(num_prompts, num_workers))
    base, extra = divmod(num_prompts, num_chunks)
    bounds = [0]
    for i in range(num_chunks):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return [range(bounds[i], bounds[i + 1]) for i in range(num_chunks)]


def run_chunks(workers: list[Any], chunks: list[range], prompts: list[list[int]], params: SamplingParams, n: int,
               max_resends: int, on_resend: Callable[[], None]) -> dict[int, tuple[ray.ObjectRef, WorkerBatch]]:
    """Run every chunk once to completion on some worker, re-sending chunks whose worker died
    (`on_resend` is called per re-send; a chunk re-sent more than `max_resends` times raises).

    A worker that failed goes back to the idle pool only once a probe call succeeds (Ray has
    restarted it and its `__init__` reloaded the current weights); one that Ray gave up on is
    dropped for this call.
    """
    pending, idle = deque(range(len(chunks))), deque(workers)
    inflight: dict[ray.ObjectRef, tuple[Any, int | None]] = {}  # chunk None = a liveness probe
    resends = [0] * len(chunks)
    results: dict[int, tuple[ray.ObjectRef, WorkerBatch]] = {}

    def resend(chunk_id: int, err: Exception | None = None) -> None:
        resends[chunk_id] += 1
        on_resend()
        if resends[chunk_id] > max_resends:
            raise RuntimeError(f"chunk {chunk_id} failed on {resends[chunk_id]} workers") from err
        pending.appendleft(chunk_id)

    while pending or any(chunk is not None for _, chunk in inflight.values()):
        while pending and idle:
            chunk_id, worker = pending.popleft(), idle.popleft()
            batch = [prompts[i] for i in chunks[chunk_id]]
            # Global prompt indices: a row's random numbers do not depend on which worker or chunk ran it.
            inflight[worker.generate.remote(batch, params, n, list(chunks[chunk_id]))] = (worker, chunk_id)
        if not inflight:
            raise RuntimeError(f"no live rollout worker left for {len(pending)} chunks")
        ready, _ = ray.wait(list(inflight), num_returns=1)
        worker, chunk_id = inflight.pop(ready[0])
        try:
            value = ray.get(ready[0])
        except ActorUnavailableError:  # restarting: probe again shortly
            time.sleep(RESTART_PROBE_INTERVAL_S)
            inflight[worker.versions.remote()] = (worker, None)
            if chunk_id is not None:
                resend(chunk_id)
            continue
        except RayActorError as err:
            if chunk_id is None:  # Ray gave up restarting it
                continue
            resend(chunk_id, err)
            inflight[worker.versions.remote()] = (worker, None)
            continue
        if chunk_id is not None:
            results[chunk_id] = (ready[0], value)
        idle.append(worker)
    return results
