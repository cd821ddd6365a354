"""RolloutWorker: a Ray actor that owns one SpecEngine (target + drafter) and serves rollout batches.

Created by the controller with `num_cpus`/`num_gpus`, `max_restarts` and a placement-group bundle
from the run config. Models load from `save_pretrained` paths inside the actor, so only paths cross
the wire. On (re)start the worker loads the latest weights posted on the `WeightBoard`: a worker
that Ray restarted after a crash serves the current policy and drafter versions, never its initial
checkpoint. Weight updates are atomic: every bucket is fetched into staging memory before any
parameter is overwritten, so a failed sync leaves the engine and its versions untouched.

`progress` runs in its own concurrency group so the controller (or a test) can watch a batch that
is in flight; everything else runs one call at a time, so weights never change mid-batch.
"""

from __future__ import annotations

import os
import time

import ray
import torch
from transformers import AutoModelForCausalLM

from specroll.rollout import EngineConfig, Rollout, SamplingParams, SpecEngine

from .config import ModelPaths
from .metrics import BatchMetrics, WorkerMetrics
from .tokenizers import tokenizer_pair
from .weight_sync import WeightPayload, WeightSyncError, receiving_transport, unpack_buckets

ROLES = ("policy", "drafter")


@ray.remote(concurrency_groups={"control": 1})
class RolloutWorker:
    def __init__(self, worker_index: int, models: ModelPaths, engine_config: EngineConfig,
                 board: ray.actor.ActorHandle | None = None, reload_timeout_s: float = 60.0):
        self.worker_index = worker_index
        dtype = engine_config.dtype
        target = AutoModelForCausalLM.from_pretrained(models.target, dtype=dtype)
        drafter = AutoModelForCausalLM.from_pretrained(models.drafter, dtype=dtype) if models.drafter else None
        self.engine = SpecEngine(target, drafter, engine_config, *tokenizer_pair(models))
        self.metrics = WorkerMetrics(worker_index)
        self.last_batch: BatchMetrics | None = None
        self.num_loads = 0
        if board is not None:
            for role, payload in ray.get(board.latest.remote(), timeout=reload_timeout_s).items():
                self.receive_weights(role, payload, rank=0, timeout_s=reload_timeout_s)
        self.metrics.record_versions(self.engine.policy_version, self.engine.drafter_version)

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int) -> list[Rollout]:
        """`SpecEngine.generate` on this worker's engine, recording the batch's metrics."""
        before = self.engine.stats.to_dict()
        rollouts = self.engine.generate(prompts, params, n)
        self.last_batch = BatchMetrics.between(before, self.engine.stats)
        self.metrics.record_batch(self.last_batch)
        return rollouts

    def receive_weights(self, role: str, payload: WeightPayload, rank: int, timeout_s: float) -> float:
        """Fetch `payload` over its transport and load it as `role`'s new version; returns seconds.

        Raises WeightSyncError (version unchanged) if the fetch fails, times out or does not fit.
        """
        if role not in ROLES:
            raise ValueError(f"role={role!r} is invalid: one of {ROLES}")
        started = time.perf_counter()
        buckets = receiving_transport(payload).fetch(payload, rank, timeout_s)
        named = unpack_buckets(payload, buckets)
        try:
            if role == "policy":
                self.engine.update_target(named, payload.version)
            else:
                self.engine.update_drafter(named, payload.version)
        except ValueError as err:  # names or shapes did not match: nothing was copied
            raise WeightSyncError(f"worker {self.worker_index}: {role} version {payload.version} "
                                  f"does not fit the model: {err}") from err
        seconds = time.perf_counter() - started
        self.num_loads += 1
        self.metrics.record_sync(role, seconds)
        self.metrics.record_versions(self.engine.policy_version, self.engine.drafter_version)
        return seconds

    def versions(self) -> dict[str, int]:
        return {"policy": self.engine.policy_version, "drafter": self.engine.drafter_version}

    def describe(self) -> dict:
        """Where this worker runs and how it is doing (node, pid, versions, last batch)."""
        ctx = ray.get_runtime_context()
        return {
            "worker_index": self.worker_index,
            "node_id": ctx.get_node_id(),
            "pid": os.getpid(),
            "num_loads": self.num_loads,
            "num_threads": torch.get_num_threads(),
            **self.versions(),
            "last_batch": self.last_batch,
        }

    @ray.method(concurrency_group="control")
    def progress(self) -> int:
        """Tokens this engine has generated so far, readable while a batch is running."""
        return self.engine.stats.generated_tokens

