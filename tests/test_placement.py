"""`engine.drafter_device` (`placement.device`, `placement.threads`): bad values refused naming what is allowed, the
core split, and what pinning actually does to threads — each thread's intra-op count and CPU mask, read back from
torch and the kernel (no timing)."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from tiny_models import tiny_lm

from specroll.rollout import EngineConfig, SpecEngine
from specroll.rollout.placement.device import DrafterPlacement, parse_drafter_device
from specroll.rollout.placement.threads import DrafterThread, TargetCores

TWO_CORES = len(os.sched_getaffinity(0)) >= 2


@pytest.mark.parametrize("value, device, count, cores", [
    ("cpu", "cpu", None, None), ("cuda:0", "cuda:0", None, None), ("cpu:1", "cpu", 1, None),
    ("cpu:cores=1", "cpu", None, {1}), ("cpu:cores=2-3,6", "cpu", None, {2, 3, 6}),
])
def test_drafter_device_parses(value, device, count, cores):
    placement = parse_drafter_device(value)
    assert placement.device == torch.device(device)
    assert placement.count == count and placement.cores == (None if cores is None else frozenset(cores))


@pytest.mark.parametrize("value", ["cpu:0", "cpu:cores=3-1", "cpu:cores=", "cpu:x", "gpu", "", 1])
def test_bad_drafter_device_is_refused_naming_what_is_allowed(value):
    with pytest.raises(ValueError, match=r"drafter_device=.*is invalid.*'cpu:N'.*'cpu:cores=LIST'"):
        EngineConfig(drafter_device=value)


def test_core_split():
    assert DrafterPlacement(torch.device("cpu"), count=1).split({0, 1, 2}) == (frozenset({2}), frozenset({0, 1}))
    assert DrafterPlacement(torch.device("cpu"), cores=frozenset({0})).split({0, 1}) == (frozenset({0}),
                                                                                         frozenset({1}))
    with pytest.raises(ValueError, match="leave the target at least one"):
        DrafterPlacement(torch.device("cpu"), count=2).split({0, 1})
    with pytest.raises(ValueError, match=r"\[5\] are not among this process's cores"):
        DrafterPlacement(torch.device("cpu"), cores=frozenset({5})).split({0, 1})


@pytest.mark.parametrize("config, field", [
    (dict(overlap="yes"), "overlap"), (dict(overlap=True, tree_width=2), "tree_width"),
    (dict(drafter_device="cpu", drafters=("model", "suffix")), "drafters"),
])
def test_overlap_settings_are_refused_where_not_served(config, field):
    with pytest.raises(ValueError, match=f"{field}="):
        EngineConfig(**config)


def test_overlap_needs_a_drafter_lm():
    with pytest.raises(ValueError, match=r"serve \('model',\)"):
        SpecEngine(tiny_lm(), None, EngineConfig(overlap=True))


@pytest.mark.skipif(not TWO_CORES, reason="needs 2 cores")
def test_drafter_thread_and_target_cores_pin_what_they_say():
    """The drafter's thread runs on its core with one intra-op thread; while pinned, every other thread of the process
    (the caller's, and the OpenMP workers it made before, with every core) is on the target's core, the caller with
    one intra-op thread; `unpin` gives masks and count back. Setting a thread count in one thread leaves the
    others' alone (OpenMP's count is per thread; torch's `set_num_threads` sets the caller's)."""
    have = sorted(os.sched_getaffinity(0))
    drafter_core, target_core = frozenset(have[-1:]), frozenset(have[:1])
    a = torch.randn(256, 256)
    torch.mm(a, a)  # the caller's OpenMP workers exist, made with every core
    before = torch.get_num_threads()
    thread = DrafterThread(drafter_core)
    try:
        seen = thread.run(lambda: (os.sched_getaffinity(threading.get_native_id()), torch.get_num_threads(),
                                   torch.mm(a, a).shape))
        assert seen[:2] == (set(drafter_core), 1)
        assert torch.get_num_threads() == before  # the drafter's count did not reach this thread
        cores = TargetCores(target_core, thread)
        masks = {tid: os.sched_getaffinity(tid) for tid in map(int, os.listdir("/proc/self/task"))}
        cores.pin()
        assert torch.get_num_threads() == 1
        for tid in map(int, os.listdir("/proc/self/task")):
            # Threads already on the drafter's core (this drafter's, other engines' drafters) are left there.
            drafters = tid == thread.native_id or masks.get(tid, set()) <= drafter_core
            assert os.sched_getaffinity(tid) <= set(drafter_core if drafters else target_core)
        assert thread.run(torch.get_num_threads) == 1
        cores.unpin()
        assert torch.get_num_threads() == before
        assert all(os.sched_getaffinity(tid) == mask for tid, mask in masks.items() if tid != thread.native_id)
    finally:
        thread.close()
