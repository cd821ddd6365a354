"""Hooks and the few fixtures every module may use: the xdist work units (the session-Ray-cluster
modules as one), one torch thread per test process, the tiny demo models built once per run,
`llama` (`tiny_models.tiny_lm`) and `study` (a one-off study of studies/, outside the package). Every pytest
process loads this file — the xdist controller too, which only schedules — so it imports neither torch nor Ray at
the top; test modules import their helpers from `tiny_models` and `ray_helpers`, never from here.
"""

from __future__ import annotations

import os

# Before anything imports ray: Ray rewrites 127.0.0.1 to the host's routable address unless it runs in
# single-node mode — tests stay on loopback. Ray 2.60's token auth stays on, as in the product.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from pathlib import Path

import pytest

pytest_plugins = ["ray_fixtures"]  # one session Ray cluster shared by every Ray test module


# Test modules with a test on the session Ray cluster (`ray_fixtures.ray_cluster`). Under xdist they form
# one work unit, so one worker starts that cluster and its shared controller (seconds of CPU each on 2
# cores) instead of every worker; every other module is a unit of its own (`--dist loadfile`).
SESSION_RAY_MODULES = frozenset({
    "test_backend_metrics", "test_eagle3_online", "test_head_online", "test_online_schedule", "test_ray_controller",
    "test_ray_drafter_lifecycle", "test_ray_metrics", "test_ray_seeded", "test_ray_shared_service",
    "test_ray_sync_restart", "test_ray_weight_sync", "test_trl_multirank", "test_trl_ray", "test_vllm_ray",
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
    strays = sorted({item.path.stem for item in items if "ray_cluster" in item.fixturenames}
                    - SESSION_RAY_MODULES)
    if strays:
        raise pytest.UsageError(f"{strays} use the session Ray cluster: add them to conftest.SESSION_RAY_MODULES")


def pytest_configure(config):
    """Tiny models: one intra-op thread is faster than two, and keeps a shared CPU from oversubscribing.
    Only where tests run: the xdist controller only schedules, and never imports torch."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.getoption("numprocesses", None):
        import torch

        torch.set_num_threads(1)


@pytest.fixture
def study(monkeypatch):
    """`study("tree_tail")`: a one-off study of the checkout's studies/ folder, imported as a script's module —
    studies are not part of the installed package (studies/README.md)."""
    import importlib

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "studies"))
    return importlib.import_module


@pytest.fixture
def llama():
    from tiny_models import tiny_lm

    return tiny_lm("llama", "sdpa")


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
