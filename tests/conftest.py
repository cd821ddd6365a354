"""Shared fixtures: tiny causal LMs (`tiny_models.build_lm`, no downloads), cheap enough to build per test.

`tiny_lm` builds a Llama / Qwen2 / Qwen3 model with *peaked* logits (a scaled-up `lm_head`) so that
greedy decoding has no near-ties: a fp32 batched forward and a row-alone forward differ by ~1e-6,
far below the gap between the best and second-best logit. Models are cached per session by their
arguments; the engine never changes weights, so sharing them between tests is safe.
"""

from __future__ import annotations

import os

# Before anything imports ray: Ray rewrites 127.0.0.1 to the host's routable address unless it runs in
# single-node mode — tests stay on loopback. Ray 2.60's token auth stays on, as in the product.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import copy
import functools
from pathlib import Path

import pytest
import torch
from tiny_models import VOCAB, build_lm
from transformers import PreTrainedModel

pytest_plugins = ["ray_fixtures"]  # one session Ray cluster shared by every Ray test module


# Test modules with a test on the session Ray cluster (`ray_fixtures.ray_cluster`). Under xdist they form
# one work unit, so one worker starts that cluster and its shared controller (seconds of CPU each on 2
# cores) instead of every worker; every other module is a unit of its own (`--dist loadfile`).
SESSION_RAY_MODULES = frozenset({
    "test_backend_metrics", "test_head_online", "test_online_schedule", "test_ray_controller", "test_ray_metrics",
    "test_ray_seeded", "test_ray_shared_service", "test_ray_sync_restart", "test_ray_weight_sync",
    "test_trl_multirank", "test_trl_ray",
})


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneRayCluster(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "the session Ray cluster" if Path(module).stem in SESSION_RAY_MODULES else module

    return OneRayCluster(config, log)


def pytest_collection_modifyitems(config, items):
    strays = sorted({Path(item.path).stem for item in items if "ray_cluster" in item.fixturenames}
                    - SESSION_RAY_MODULES)
    if strays:
        raise pytest.UsageError(f"{strays} use the session Ray cluster: add them to conftest.SESSION_RAY_MODULES")


# Tiny models: one intra-op thread is faster than two, and keeps a shared CPU from oversubscribing.
torch.set_num_threads(1)


@functools.cache
def tiny_lm(arch: str = "llama", attn: str = "sdpa", **kwargs) -> PreTrainedModel:
    """Session-cached `build_lm`; do not mutate the returned model."""
    return build_lm(arch, attn, **kwargs)


@functools.cache
def noisy_copy(arch: str = "llama", attn: str = "sdpa", noise: float = 0.03, seed: int = 1) -> PreTrainedModel:
    """The target with Gaussian noise (`noise` × the weights' std) on `lm_head`: a partly agreeing drafter."""
    model = copy.deepcopy(tiny_lm(arch, attn))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = model.lm_head.weight
        w.add_(noise * w.std() * torch.randn(w.shape, generator=gen))
    return model


@pytest.fixture
def llama() -> PreTrainedModel:
    return tiny_lm("llama", "sdpa")


def make_prompts(count: int, min_len: int, max_len: int, vocab: int = VOCAB, seed: int = 0) -> list[list[int]]:
    """`count` random prompts with lengths cycling through [min_len, max_len]."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [min_len + i % (max_len - min_len + 1) for i in range(count)]
    return [torch.randint(vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.fixture(scope="session")
def tiny_demo_cache(tmp_path_factory):
    """A cache folder (`SPECROLL_CACHE`) holding the tiny demo recipe's models, built once per test run:
    xdist workers share it (the first builds it under a lock, the others load it)."""
    from filelock import FileLock

    from specroll.demo.model_cache import load_or_build_demo_models
    from specroll.demo.recipe import DemoRecipe

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's base folder, above every worker's own
    cache = root / "tiny_demo_cache"
    with FileLock(str(cache) + ".lock"):
        load_or_build_demo_models(DemoRecipe.tiny(), cache_dir=cache, progress=False)
    return cache
