"""Versioned weight sync: buckets keep dtypes (and travel in the wire dtype); both transports load weights and
move the version; a staging that times out raises within a bounded time and leaves the worker's version
unchanged. The broadcast transport keeps one group for every sync (formed again only when a worker
restarted, shut down on close), puts nothing in the object store, and a sync adds at most twice its payload
to host memory (the sender and a worker together)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import pytest
import ray
import torch
from ray_helpers import GREEDY, make_config, prompts_for, tiny_llama, versions_once_alive

from specroll.integrations.ray_backend.controller import RolloutController
from specroll.integrations.ray_backend.settings import SyncConfig
from specroll.integrations.ray_backend.sync.broadcast import TorchBroadcastTransport
from specroll.integrations.ray_backend.sync.payload import PeerRoute
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


def test_floating_tensors_travel_in_the_wire_dtype_but_rotary_frequencies_stay_fp32():
    tensors = {"w": torch.randn(4, 3), "rotary_emb.inv_freq": torch.rand(8), "ids": torch.arange(5)}
    buckets, layout = pack_buckets(tensors, bucket_bytes=1 << 10, version=1, wire_dtype=torch.bfloat16)
    out = unpack_buckets(layout, list(buckets))
    assert out["w"].dtype == torch.bfloat16 and torch.equal(out["w"], tensors["w"].to(torch.bfloat16))
    assert out["rotary_emb.inv_freq"].dtype == torch.float32 and torch.equal(out["ids"], tensors["ids"])
    assert sum(layout.bucket_sizes) < sum(t.numel() * t.element_size() for t in tensors.values())


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
        controller.transport.close(sync.timeout_s)
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
    worker = controller.workers[1]
    before = ray.get(worker.versions.remote())
    buckets, layout = pack_buckets(tiny_llama(32, 2, seed=34).state_dict(), 2**20, before["policy"] + 1)
    transport = TorchBroadcastTransport("gloo")
    transport.open([worker], timeout_s=30.0)
    silent = transport.publish(buckets, layout, 1)  # published, never streamed
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"within 2\.0s"):
        ray.get(worker.stage_weights.remote("policy", silent, 1, 2.0))
    assert time.monotonic() - started < 15
    assert ray.get(worker.versions.remote()) == before
    assert ray.get(worker.sync_group.remote()) is None  # a group left out of step by a failure is left
    transport.close(timeout_s=30.0)


def test_weights_that_do_not_fit_fail_the_sync_before_any_worker_changes(controller):
    before = [ray.get(w.versions.remote()) for w in controller.workers]
    board = ray.get(controller.board.latest.remote())
    with pytest.raises(WeightSyncError, match="does not fit"):
        controller.sync_policy(tiny_llama(16, 2, seed=35).state_dict(), controller.policy_version + 1)
    assert [ray.get(w.versions.remote()) for w in controller.workers] == before
    assert ray.get(controller.board.latest.remote()).keys() == board.keys()
    assert all(ray.get(controller.board.latest.remote())[k].version == board[k].version for k in board)


@pytest.fixture(scope="module")
def broadcast_controller(ray_cluster, tiny_model_paths, tmp_path_factory):
    """Two workers on a gloo broadcast group, serving a 9.4M-parameter (38 MB fp32) target in 1 MiB buckets."""
    path = str(tmp_path_factory.mktemp("sync_models") / "target")
    tiny_llama(512, 4, seed=50).save_pretrained(path)
    config = make_config({**tiny_model_paths, "target": path})
    config.sync = SyncConfig(transport="torch_distributed", bucket_mb=1.0, timeout_s=30.0)
    ctl = RolloutController(config)
    yield ctl
    ctl.shutdown()


def policy_weights(seed: int) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in tiny_llama(512, 4, seed=seed).named_parameters()}


def test_broadcast_group_is_formed_once_and_reused_by_every_sync(broadcast_controller):
    ctl = broadcast_controller
    groups = []
    for seed in (51, 52, 53):
        ctl.sync_policy(policy_weights(seed), ctl.policy_version + 1)
        groups.append({ray.get(w.sync_group.remote()) for w in ctl.workers})
    assert ctl.transport.num_groups_formed == 1
    assert groups == [{ctl.transport.route.group_id}] * 3
    board = ray.get(ctl.board.latest.remote())["policy"]
    assert isinstance(board.route, PeerRoute) and board.version == ctl.policy_version  # no object-store copy
    assert not ray.get(ctl.board.__ray_call__.remote(lambda _: "torch" in sys.modules))  # the board stays light


def test_sync_adds_at_most_twice_the_payload_to_host_memory(broadcast_controller, study):
    ctl = broadcast_controller
    sync_bench = study("sync_bench")
    named = policy_weights(54)
    payload = sum(t.numel() * t.element_size() for t in named.values())
    pids = [os.getpid(), *(sync_bench.actor_pid(w) for w in ctl.workers)]
    sample = sync_bench.measure_sync(ctl, named, ctl.policy_version + 1, pids)
    sender, worker = sample.process_growth[0], max(sample.process_growth[1:])
    assert sender + worker <= 2 * payload, (sender / payload, worker / payload)


def test_restarted_worker_reloads_the_version_from_a_peer(broadcast_controller, tiny_model_paths):
    ctl = broadcast_controller
    version = ctl.policy_version + 1
    target = tiny_llama(512, 4, seed=55)
    ctl.sync_policy(policy_weights(55), version)
    formed = ctl.transport.num_groups_formed
    ray.kill(ctl.workers[0], no_restart=False)
    assert versions_once_alive(ctl.workers[0])["policy"] == version  # exported to it by worker 1
    via_ray = [r.completion_ids for r in ctl.generate(prompts_for(3), GREEDY, n=1)]
    assert via_ray == greedy_outputs_with(target, tiny_model_paths["drafter"])
    ctl.sync_policy(policy_weights(56), version + 1)  # the restarted worker joins a new group
    assert ctl.transport.num_groups_formed == formed + 1
    assert [ray.get(w.versions.remote())["policy"] for w in ctl.workers] == [version + 1] * 2


def test_close_shuts_the_group_down_on_every_worker(broadcast_controller):  # last: it shuts the controller down
    ctl = broadcast_controller
    ctl.transport.close(timeout_s=30.0)
    assert [ray.get(w.sync_group.remote()) for w in ctl.workers] == [None, None]
    ctl.sync_policy(policy_weights(57), ctl.policy_version + 1)  # a closed transport forms a new group
    assert {ray.get(w.sync_group.remote()) for w in ctl.workers} == {ctl.transport.route.group_id}
    ctl.shutdown()
    assert ctl.transport.members == [] and ctl.transport.route is None
