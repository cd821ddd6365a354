"""Versioned weight sync: buckets keep dtypes; both transports load weights and move the version; a
staging that times out raises within a bounded time and leaves the worker's version unchanged."""

from __future__ import annotations

import dataclasses
import time

import pytest
import ray
import torch
from ray_helpers import GREEDY, prompts_for, tiny_llama

from specroll.integrations.ray_backend.sync.broadcast import BroadcastRoute, TorchBroadcastTransport
from specroll.integrations.ray_backend.sync.protocol import WeightSyncError, pack_buckets, unpack_buckets
from specroll.rollout import EngineConfig, SpecEngine


def test_buckets_round_trip_every_dtype_exactly():
    tensors = {
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "fp16": torch.randn(7).to(torch.float16),
        "fp32": torch.randn(4, 4),
        "i64": torch.arange(6).reshape(2, 3),
        "empty": torch.zeros(0),
    }
    buckets, layout = pack_buckets(tensors, bucket_bytes=40, version=4)
    assert len(buckets) > 1 and layout.version == 4
    out = unpack_buckets(layout, buckets)
    for name, tensor in tensors.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor), name


def greedy_outputs_with(target, drafter_path):
    from transformers import AutoModelForCausalLM

    engine = SpecEngine(target, AutoModelForCausalLM.from_pretrained(drafter_path),
                        EngineConfig(max_batch_size=8, max_seq_len=128, gamma=2))
    return [r.completion_ids for r in engine.generate(prompts_for(3), GREEDY, n=1)]


def test_gloo_broadcast_sync_loads_weights_and_moves_version(controller, tiny_model_paths):
    target = tiny_llama(32, 2, seed=31)
    version = controller.policy_version + 1
    transport, sync = controller.transport, controller.config.sync
    controller.transport = TorchBroadcastTransport("gloo")
    controller.config.sync = dataclasses.replace(sync, bucket_mb=2**14 / 2**20)  # several buckets
    try:
        controller.sync_policy(target.state_dict(), version)
    finally:
        controller.transport, controller.config.sync = transport, sync
    assert ray.get(controller.board.latest.remote())["policy"].version == version
    assert [ray.get(w.versions.remote())["policy"] for w in controller.workers] == [version] * 2
    via_ray = [r.completion_ids for r in controller.generate(prompts_for(3), GREEDY, n=1)]
    assert via_ray == greedy_outputs_with(target, tiny_model_paths["drafter"])


def test_object_store_sync_moves_every_worker_version(controller):
    version = controller.policy_version + 1
    seconds = controller.sync_policy(tiny_llama(32, 2, seed=32).state_dict(), version)
    assert seconds > 0
    assert [ray.get(w.versions.remote())["policy"] for w in controller.workers] == [version] * 2


@ray.remote(num_cpus=0)
def never_ready(seconds: float) -> bytes:
    time.sleep(seconds)
    return b""


def test_object_store_timeout_raises_in_bounded_time_and_keeps_version(controller):
    worker = controller.workers[0]
    before = ray.get(worker.versions.remote())
    _, layout = pack_buckets(tiny_llama(32, 2, seed=33).state_dict(), 2**20, before["policy"] + 1)
    blocker = never_ready.remote(120)
    stuck = type(layout)(layout.version, layout.metas, layout.bucket_sizes, route=(blocker,))
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match="timed out"):
        ray.get(worker.stage_weights.remote("policy", stuck, 1, 2.0))
    assert time.monotonic() - started < 15
    assert ray.get(worker.versions.remote()) == before
    ray.cancel(blocker, force=True)


def test_gloo_timeout_raises_in_bounded_time_and_keeps_version(controller):
    import torch.distributed as dist

    worker = controller.workers[1]
    before = ray.get(worker.versions.remote())
    _, layout = pack_buckets(tiny_llama(32, 2, seed=34).state_dict(), 2**20, before["policy"] + 1)
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)  # nobody sends
    route = BroadcastRoute("127.0.0.1", store.port, 2, "gloo")
    silent = type(layout)(layout.version, layout.metas, layout.bucket_sizes, route=route)
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"within 2\.0s"):
        ray.get(worker.stage_weights.remote("policy", silent, 1, 2.0))
    assert time.monotonic() - started < 15
    assert ray.get(worker.versions.remote()) == before


def test_weights_that_do_not_fit_fail_the_sync_before_any_worker_changes(controller):
    before = [ray.get(w.versions.remote()) for w in controller.workers]
    board = ray.get(controller.board.latest.remote())
    with pytest.raises(WeightSyncError, match="does not fit"):
        controller.sync_policy(tiny_llama(16, 2, seed=35).state_dict(), controller.policy_version + 1)
    assert [ray.get(w.versions.remote()) for w in controller.workers] == before
    assert ray.get(controller.board.latest.remote()).keys() == board.keys()
    assert all(ray.get(controller.board.latest.remote())[k].version == board[k].version for k in board)
