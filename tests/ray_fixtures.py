"""Shared Ray fixtures: ONE two-node local cluster for every Ray test, tiny saved models, one controller.

`ray.init` costs seconds, so all Ray tests share a session-scoped `ray.cluster_utils.Cluster` (a head
node and a second node on this machine, both on 127.0.0.1), which also serves the multi-node
placement test. The fixtures reach every test module through `pytest_plugins` in conftest.py: never
import `ray_cluster` into a test module (a second definition of a session fixture is a second cluster,
which shuts this one down under every other module's actors). Every pytest process loads this plugin
(the xdist controller too), so it imports Ray and specroll only inside the fixtures; the helpers test
modules import live in `ray_helpers`.
"""

from __future__ import annotations

import os

import pytest

# Ray rewrites 127.0.0.1 to the host's routable IP unless it believes it runs on a laptop; this keeps
# every node, and the driver's GCS address, on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

CPUS_PER_NODE = 3  # logical CPUs: tests place 2 workers + a learner per node on 2 physical cores


@pytest.fixture(scope="session")
def tiny_model_paths(tmp_path_factory) -> dict[str, str]:
    """A 2-layer target and a 1-layer drafter saved with `save_pretrained` (workers load by path)."""
    from ray_helpers import tiny_llama

    root = tmp_path_factory.mktemp("ray_models")
    paths = {"target": str(root / "target"), "drafter": str(root / "drafter")}
    tiny_llama(32, 2, seed=0).save_pretrained(paths["target"])
    tiny_llama(16, 1, seed=1).save_pretrained(paths["drafter"])
    return paths


@pytest.fixture(scope="session")
def ray_cluster():
    """Two Ray nodes on 127.0.0.1, connected as this process's Ray; torn down at session end."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    ray_constants.ENABLE_RAY_CLUSTER = False  # same as the env var above, if ray was imported first
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": CPUS_PER_NODE, "include_dashboard": False, "node_ip_address": "127.0.0.1",
        "resources": {"node_head": 1},
    })
    cluster.add_node(num_cpus=CPUS_PER_NODE, node_ip_address="127.0.0.1", resources={"node_second": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, _node_ip_address="127.0.0.1")
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="session")
def controller(ray_cluster, tiny_model_paths):
    """One shared 2-worker controller (worker start-up costs seconds); tests may move its versions."""
    from ray_helpers import shared_config

    from specroll.integrations.ray_backend.controller import RolloutController

    ctl = RolloutController(shared_config(tiny_model_paths))
    yield ctl
    ctl.shutdown()
