"""One versioned sync of a role's weights to every live rollout worker, all or nothing (`protocol`'s steps in order).

    seconds = sync_weights(transport, board, workers, "drafter", version.weights, version=4, config=sync_config,
                           wire_dtype=torch.bfloat16, digest=learner_digest, drafter=drafter_meta(version))

Waits for the workers Ray is restarting, stages on all, posts on the weight board (the commit point), commits on
all. With a `digest` (the learner's, `DrafterVersion.digest`) every worker recomputes it over what arrived
and refuses a version that does not match (corrupted in flight), so that sync fails before the commit point.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
import torch
from ray.exceptions import RayError

from ..settings import SyncConfig
from .payload import DrafterMeta
from .protocol import (
    WeightSyncError,
    WeightTransport,
    commit_weights,
    discard_staged,
    pack_buckets,
    stage_weights,
    wait_for_workers,
)


def sync_weights(transport: WeightTransport, board: Any, workers: Sequence[Any], role: str,
                 named_tensors: Mapping[str, torch.Tensor], version: int, config: SyncConfig,
                 wire_dtype: torch.dtype | None, digest: str | None = None, drafter: DrafterMeta | None = None
                 ) -> float:
    """Sync `named_tensors` as `version` of `role` (a drafter's with the rest of its version, `drafter`); returns
    seconds.

    Each phase waits at most `config.timeout_s`. A failure before the commit point raises WeightSyncError and
    changes nothing; after it, every worker ends on `version` (one that cannot load it is restarted, and reloads
    it from the board). Workers Ray gave up restarting are skipped.
    """
    started = time.perf_counter()
    live = wait_for_workers(workers, config.timeout_s)
    buckets, layout = pack_buckets(named_tensors, config.bucket_bytes, version, wire_dtype=wire_dtype)
    layout = dataclasses.replace(layout, digest=digest, drafter=drafter)
    payload = stage_weights(transport, live, role, buckets, layout, config.timeout_s)  # the board's payload
    try:
        ray.get(board.post.remote(role, payload), timeout=config.timeout_s)
    except RayError as err:
        discard_staged(live, role)
        raise WeightSyncError(f"{role} version {version} could not be posted on the weight board: {err}") from err
    commit_weights(live, role, payload, config.timeout_s)
    return time.perf_counter() - started
