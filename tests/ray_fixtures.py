"""Shared Ray fixtures: ONE two-node local cluster for every Ray test, and tiny saved models.

`ray.init` costs seconds, so all Ray tests share a session-scoped `ray.cluster_utils.Cluster` (a head
node and a second node on this machine, both on 127.0.0.1), which also serves the multi-node
placement test. The fixtures reach every test module through `pytest_plugins` in conftest.py: never
import `ray_cluster` into a test module (a second definition of a session fixture is a second cluster,
which shuts this one down under every other module's actors). The Ray tests' shared helpers (prompts,
a killed worker, a restarted one's versions) live here too.
"""

from __future__ import annotations

import os
import threading
import time

# Ray rewrites 127.0.0.1 to the host's routable IP unless it believes it runs on a laptop; this keeps
# every node, and the driver's GCS address, on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray
from ray._private import ray_constants
from ray.cluster_utils import Cluster
from ray.exceptions import ActorUnavailableError
from tiny_models import VOCAB, build_lm
from transformers import LlamaForCausalLM

from specroll.integrations.model_source import ModelPaths
from specroll.integrations.ray_backend.controller import RolloutController
from specroll.integrations.ray_backend.settings import ActorResources, ControllerConfig, SyncConfig, TopologyConfig
from specroll.online_drafter import LearnerConfig
from specroll.rollout import EngineConfig, SamplingParams

CPUS_PER_NODE = 3  # logical CPUs: tests place 2 workers + a learner per node on 2 physical cores


def tiny_llama(hidden: int, layers: int, seed: int) -> LlamaForCausalLM:
    return build_lm(vocab=VOCAB, hidden=hidden, layers=layers, seed=seed, logit_scale=1.0)


@pytest.fixture(scope="session")
def tiny_model_paths(tmp_path_factory) -> dict[str, str]:
    """A 2-layer target and a 1-layer drafter saved with `save_pretrained` (workers load by path)."""
    root = tmp_path_factory.mktemp("ray_models")
    paths = {"target": str(root / "target"), "drafter": str(root / "drafter")}
    tiny_llama(32, 2, seed=0).save_pretrained(paths["target"])
    tiny_llama(16, 1, seed=1).save_pretrained(paths["drafter"])
    return paths


@pytest.fixture(scope="session")
def ray_cluster():
    """Two Ray nodes on 127.0.0.1, connected as this process's Ray; torn down at session end."""
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


def make_config(paths: dict[str, str], num_workers: int = 2, strategy: str | None = "PACK",
                max_restarts: int = 2, online_learning: bool = False) -> ControllerConfig:
    """Two 1-CPU workers on tiny models, greedy-friendly engine settings, fixed γ = 2 (the controller turns
    `record_signals` on itself when it has a learner)."""
    return ControllerConfig(
        models=ModelPaths(paths["target"], paths["drafter"]),
        topology=TopologyConfig(num_workers=num_workers, worker=ActorResources(num_cpus=1),
                                learner=ActorResources(num_cpus=1), placement_strategy=strategy,
                                max_restarts=max_restarts),
        engine=EngineConfig(max_batch_size=8, max_seq_len=128, gamma=2),
        sync=SyncConfig(timeout_s=30.0),
        learner=LearnerConfig() if online_learning else None,
    )


def shared_config(paths: dict[str, str]) -> ControllerConfig:
    """The shared controller's config: its two workers on the two nodes (the multi-node placement test
    reads it, so no test starts a second pair of workers for that)."""
    return make_config(paths, strategy="STRICT_SPREAD")


@pytest.fixture(scope="session")
def controller(ray_cluster, tiny_model_paths):
    """One shared 2-worker controller (worker start-up costs seconds); tests may move its versions."""
    ctl = RolloutController(shared_config(tiny_model_paths))
    yield ctl
    ctl.shutdown()


GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)


def prompts_for(num: int) -> list[list[int]]:
    return [[(7 * i + j) % VOCAB for j in range(3 + i % 4)] for i in range(num)]


def generate_killing_a_worker(controller, victim, prompts: list[list[int]], n: int) -> list:
    """`controller.generate` (sampled, long completions) with `victim` killed once it has started; Ray
    restarts it."""
    params = SamplingParams(max_new_tokens=120, temperature=1.0, seed=3)
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(rollouts=controller.generate(prompts, params, n=n)))
    thread.start()
    deadline = time.monotonic() + 60
    start_tokens = ray.get(victim.progress.remote())
    while ray.get(victim.progress.remote()) == start_tokens and time.monotonic() < deadline:
        time.sleep(0.05)
    ray.kill(victim, no_restart=False)
    thread.join(timeout=120)
    return out["rollouts"]


def versions_once_alive(worker, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(worker.versions.remote())
        except ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
