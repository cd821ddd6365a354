"""RolloutWorker: a Ray actor that owns one rollout engine (target + drafter) and serves rollout batches.

The engine is specroll's `SpecEngine`, or with `engine.kind: vllm` an in-process `vllm.LLM` (`VllmEngine`, one per
worker, on the worker's own folders; the worker keeps Hugging Face copies of both models beside it, which check
arriving versions, record the learner's signals, serve a restarted peer's export and follow every commit).

The drafter is what the engine config asks for (`model_source.load_drafter`): the drafter LM, or an
EAGLE / Medusa head, whose verification-time hidden states the rollouts then carry for its learner.

Created by the controller with `num_cpus`/`num_gpus`, `max_restarts` and a placement-group bundle
from the run config; it runs torch on as many threads as it has whole CPUs (`threads`), whatever
`OMP_NUM_THREADS` it inherited (`integrations.threads`). Models load from `save_pretrained` paths
inside the actor, so only paths cross
the wire. On (re)start the worker loads the latest weights posted on the `WeightBoard`: a worker
that Ray restarted after a crash serves the current policy and drafter versions, never its initial
checkpoint. Weight updates come in two steps, so the controller can make a sync all-or-nothing
across workers: `stage_weights` fetches every bucket into staging memory on the engine's device (the
transport's device: NCCL buckets arrive on the GPU) and checks it fits the model, changing nothing the
engine serves; `commit_weights` copies the staged version in (device to device when the transport's
device is the engine's) and moves the version. On the broadcast transport the worker is a member of the
controller's persistent group (`join_sync_group` / `leave_sync_group`), and it exports the versions it
holds to a peer that restarted (`export_weights`: the weight board keeps only who holds them).

`progress` runs in its own concurrency group so the controller (or a test) can watch a batch that
is in flight, and `export_weights` in another, so a restarted peer is not kept waiting by a batch;
everything else runs one call at a time, so weights never change mid-batch.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from dataclasses import dataclass

import ray
import torch
from ray.exceptions import RayError
from transformers import AutoModelForCausalLM

from specroll.integrations.model_source import ModelPaths, load_drafter, tokenizer_pair
from specroll.integrations.threads import ThreadSetting, current_threads, set_torch_threads
from specroll.rollout import EngineConfig, Rollout, SamplingParams, SpecEngine
from specroll.rollout.core.stats import BatchStats
from specroll.rollout.drafters.draft_vocab import DraftVocab
from specroll.rollout.drafters.version import DrafterVersion, drafter_digest
from specroll.rollout.engine import engine_state, load_engine_state
from specroll.rollout.models.weights import check_fits, copy_into

from ..vllm.settings import VllmSettings
from .metrics import WorkerMetrics
from .sync.broadcast import BroadcastRoute, GroupMember
from .sync.payload import PeerRoute
from .sync.protocol import (
    ObjectStoreTransport,
    WeightPayload,
    WeightSyncError,
    drafter_meta,
    drafter_version,
    fetch_from_object_store,
    pack_buckets,
    unpack_buckets,
)

ROLES = ("policy", "drafter")
EXPORT_BUCKET_BYTES = 64 << 20  # a restarted peer's copy goes through the object store in buckets of this size


@dataclass(frozen=True)
class WorkerBatch:
    """What `RolloutWorker.generate` returns: the rollouts, in order, the engine's counters over the call, and
    which worker made them: its index and its `incarnation` (new at every restart)."""

    rollouts: list[Rollout]
    stats: BatchStats
    worker_index: int
    incarnation: str


@dataclass(frozen=True)
class StagedWeights:
    """A fetched version waiting for `commit_weights`, the seconds its fetch took, and for a drafter the whole
    version that arrived (weights, draft vocabulary, acceptance)."""

    version: int
    named: dict[str, torch.Tensor]
    fetch_s: float
    drafter: DrafterVersion | None = None


@ray.remote(concurrency_groups={"control": 1, "export": 1})
class RolloutWorker:
    def __init__(self, worker_index: int, models: ModelPaths, engine_config: EngineConfig,
                 board: ray.actor.ActorHandle | None = None, reload_timeout_s: float = 60.0, threads: int = 1,
                 vllm: VllmSettings | None = None):
        self.worker_index = worker_index
        self.incarnation = uuid.uuid4().hex  # Ray re-runs __init__ on a restart: a batch says which process made it
        set_torch_threads(threads, self._process_name())  # before any torch work: the inter-op pool is sized once
        dtype = engine_config.dtype
        target = AutoModelForCausalLM.from_pretrained(models.target, dtype=dtype)
        drafter = load_drafter(models, engine_config, target)  # a drafter LM, an EAGLE / Medusa head, or None
        if engine_config.kind == "vllm":
            from specroll.integrations.vllm.engine import VllmEngine

            self.engine = VllmEngine.from_paths(models, target, engine_config, vllm)
        else:
            self.engine = SpecEngine(target, drafter, engine_config, *tokenizer_pair(models))
        self.models = {"policy": target, "drafter": drafter}  # the modules the engine serves
        self.metrics = WorkerMetrics(worker_index)
        self.num_loads = 0
        self.staged: dict[str, StagedWeights] = {}
        self.served_names: dict[str, tuple[str, ...]] = {}  # per role: the names the committed version carried
        self.sync_member = GroupMember()
        self._weights_lock = threading.Lock()  # a commit's writes vs `export_weights`' reads (another thread)
        if board is not None:
            for role, payload in ray.get(board.latest.remote(), timeout=reload_timeout_s).items():
                self.stage_weights(role, payload, rank=0, timeout_s=reload_timeout_s)
                self.commit_weights(role, payload.version)
        self.metrics.record_versions(self.engine.policy_version, self.engine.drafter_version)

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int,
                 prompt_indices: list[int] | None = None) -> WorkerBatch:
        """`SpecEngine.generate` on this worker's engine (`prompt_indices`: the prompts' indices in the
        whole call, which key their random numbers), with the call's stats (also exported)."""
        before = self.engine.stats.totals()
        rollouts = self.engine.generate(prompts, params, n, prompt_indices=prompt_indices)
        stats = self.engine.stats.since(before)
        self.metrics.record_batch(stats)
        return WorkerBatch(rollouts, stats, self.worker_index, self.incarnation)

    def draft_vocab(self) -> list[int] | None:
        """The token ids the engine's drafter drafts over now (None: the whole vocabulary)."""
        ids = self.engine.draft_vocab()
        return None if ids is None else ids.tolist()

    def break_even_acceptance(self) -> float | None:
        """`SpecEngine.break_even_acceptance` of this worker's engine (for the learner's watchdog)."""
        return self.engine.break_even_acceptance()

    def stage_weights(self, role: str, payload: WeightPayload, rank: int, timeout_s: float) -> int:
        """Fetch `payload` over its route into staging memory, replacing any staged `role` version; returns
        this worker's index (the weight board lists the workers that hold a version).

        The engine keeps serving what it has. Raises WeightSyncError (nothing staged) if the fetch
        fails, times out or does not fit the model.
        """
        if role not in ROLES:
            raise ValueError(f"role={role!r} is invalid: one of {ROLES}")
        self.staged.pop(role, None)
        model = self.models[role]
        if model is None:
            raise WeightSyncError(f"worker {self.worker_index} has no drafter to load version {payload.version} into")
        started = time.perf_counter()
        named = self._receive(role, payload, rank, timeout_s)
        drafter = drafter_version(payload, named) if role == "drafter" else None
        if payload.digest is not None:
            arrived = drafter_digest(named) if drafter is None else drafter.digest()
            if arrived != payload.digest:
                raise WeightSyncError(f"worker {self.worker_index}: {role} version {payload.version} arrived with "
                                      f"digest {arrived[:12]}, not the sender's {payload.digest[:12]}: corrupted in "
                                      "flight, refused (the version served is kept)")
        try:
            check_fits(model, named, role)
            if drafter is not None and drafter.draft_vocab is not None:
                DraftVocab(drafter.draft_vocab, self.engine.vocab_size)
        except ValueError as err:
            raise WeightSyncError(f"worker {self.worker_index}: {role} version {payload.version} "
                                  f"does not fit the model: {err}") from err
        self.staged[role] = StagedWeights(payload.version, named, time.perf_counter() - started, drafter)
        return self.worker_index

    def commit_weights(self, role: str, version: int) -> float:
        """Load the staged `version` of `role` into the engine and move its version; returns the seconds
        of fetch and load. Raises WeightSyncError (nothing changed) when that version is not staged —
        e.g. the worker restarted since it was staged."""
        staged = self.staged.get(role)
        if staged is None or staged.version != version:
            raise WeightSyncError(f"worker {self.worker_index} has no staged {role} version {version} to commit")
        started = time.perf_counter()
        with self._weights_lock:
            if role == "policy":
                self.engine.update_target(staged.named, version)
            else:
                self.engine.load_drafter(staged.drafter)
            if not isinstance(self.engine, SpecEngine):  # vLLM holds its own copy: the worker's follows it
                copy_into(self.models[role], staged.named, role)
            self.served_names[role] = tuple(staged.named)
            del self.staged[role]
        seconds = staged.fetch_s + time.perf_counter() - started
        self.num_loads += 1
        self.metrics.record_sync(role, seconds)
        self.metrics.record_versions(self.engine.policy_version, self.engine.drafter_version)
        return seconds

    def discard_staged(self, role: str) -> None:
        """Drop a staged version that will not be committed (its sync failed elsewhere)."""
        self.staged.pop(role, None)

    def join_sync_group(self, route: BroadcastRoute, rank: int, timeout_s: float) -> None:
        """Join the controller's broadcast group as `rank` (leaving any other); every later sync receives on it."""
        self.sync_member.join(route, rank, timeout_s)

    def leave_sync_group(self) -> None:
        """Shut this worker's side of the broadcast group down (the controller's shutdown, or a new group)."""
        self.sync_member.leave()

    def sync_group(self) -> str | None:
        """The id of the broadcast group this worker is a member of (None: none)."""
        return self.sync_member.group_id

    @ray.method(concurrency_group="export")
    def export_weights(self, role: str, version: int) -> WeightPayload:
        """`version` of `role` as an object-store payload, from staging or from what the engine serves, for a
        peer that restarted. Raises WeightSyncError when this worker holds neither."""
        with self._weights_lock:
            staged = self.staged.get(role)
            if staged is not None and staged.version == version:
                named, drafter = staged.named, staged.drafter
            elif self.versions()[role] == version and role in self.served_names:
                named, drafter = self._served_tensors(role), None
                if role == "drafter":
                    drafter = DrafterVersion(version, named, self.engine.draft_vocab(), self.engine.drafter_acceptance,
                                             self.engine.drafter_invariant_acceptance)
            else:
                raise WeightSyncError(f"worker {self.worker_index} holds no {role} version {version} "
                                      f"(serves {self.versions()[role]})")
            buckets, layout = pack_buckets(named, EXPORT_BUCKET_BYTES, version)
            layout = dataclasses.replace(layout, drafter=None if drafter is None else drafter_meta(drafter))
            return ObjectStoreTransport().publish(buckets, layout, 1)

    def _served_tensors(self, role: str) -> dict[str, torch.Tensor]:
        """The committed version's tensors as the engine holds them, by the names it came with."""
        model = self.models[role]
        held = dict(model.named_parameters()) | dict(model.named_buffers())
        return {name: held[name] for name in self.served_names[role]}

    def _receive(self, role: str, payload: WeightPayload, rank: int, timeout_s: float) -> dict[str, torch.Tensor]:
        """The named tensors of `payload`, fetched over its route: the object store, the broadcast group, or
        (from the weight board, after a broadcast) a peer that holds the version."""
        if isinstance(payload.route, tuple):
            return unpack_buckets(payload, fetch_from_object_store(payload, timeout_s))
        if isinstance(payload.route, BroadcastRoute):
            return unpack_buckets(payload, self.sync_member.fetch(payload, rank, timeout_s))
        if isinstance(payload.route, PeerRoute):
            return self._receive_from_peer(role, payload, timeout_s)
        raise WeightSyncError(f"payload route {type(payload.route).__name__} is unknown")

    def _receive_from_peer(self, role: str, payload: WeightPayload, timeout_s: float) -> dict[str, torch.Tensor]:
        deadline = time.monotonic() + timeout_s
        failures = []
        try:
            holders = ray.get(payload.route.holders, timeout=timeout_s)
        except RayError as err:
            raise WeightSyncError(f"worker {self.worker_index}: the holders of {role} version {payload.version} "
                                  f"are unknown: {err}") from err
        for index, holder in holders:
            if index == self.worker_index:
                continue
            try:
                exported = ray.get(holder.export_weights.remote(role, payload.version), timeout=_left(deadline))
                return unpack_buckets(exported, fetch_from_object_store(exported, _left(deadline)))
            except (RayError, WeightSyncError) as err:
                failures.append(f"worker {index}: {err}")
        raise WeightSyncError(f"worker {self.worker_index}: no peer could export {role} version {payload.version} "
                              f"within {timeout_s}s ({'; '.join(failures) or 'no other holder'})")

    def engine_state(self) -> dict:
        """What this engine learnt while it ran (`SpecEngine.state_dict`: suffix history, γ statistics; a vLLM
        engine keeps none)."""
        return engine_state(self.engine) if isinstance(self.engine, SpecEngine) else {}

    def load_engine_state(self, state: dict) -> None:
        """Take back an `engine_state()` (a resumed run's, of the worker with this index)."""
        if isinstance(self.engine, SpecEngine):
            load_engine_state(self.engine, state)

    def drafter_digest(self) -> str | None:
        """The digest of the drafter this engine serves, computed here over its weights as the engine holds them
        (`SpecEngine.served_drafter_digest`, in the engine's dtype); None for an engine without a drafter that has
        weights."""
        drafter = self.models["drafter"]
        if drafter is None:
            return None
        with self._weights_lock:
            if not isinstance(self.engine, SpecEngine):  # what vLLM's proposer holds, hashed where it holds it
                served = set(self.engine.served_drafter_digests())
                return served.pop() if len(served) == 1 else None
            return self.engine.served_drafter_digest(drafter)

    def served_policy(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Copies (on the CPU) of the served policy's tensors named `names` (a restarted head learner's reads)."""
        held = dict(self.models["policy"].named_parameters())
        missing = sorted(set(names) - set(held))
        if missing:
            raise ValueError(f"names {missing[:4]} are not parameters of the served policy")
        return {name: held[name].detach().to("cpu", copy=True) for name in names}

    def threads(self) -> ThreadSetting:
        """The torch threads this worker runs with (as torch reports them in the thread that serves calls)."""
        return current_threads(self._process_name())

    def _process_name(self) -> str:
        return f"rollout worker {self.worker_index}"

    def versions(self) -> dict[str, int]:
        return {"policy": self.engine.policy_version, "drafter": self.engine.drafter_version}

    @ray.method(concurrency_group="control")
    def progress(self) -> int:
        """Tokens this engine has generated so far, readable while a batch is running."""
        return self.engine.stats.generated_tokens


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
