"""The Ray tests' shared helpers: tiny models, the controller configs, prompts, a killed worker, a
restarted one's versions. The fixtures (the session cluster, saved models, the shared controller) are
in `ray_fixtures`, which stays light to import (it is loaded by every pytest process, the xdist
controller included); test modules import these helpers from here.
"""

from __future__ import annotations

import threading
import time

import ray
from ray.exceptions import ActorUnavailableError
from tiny_models import VOCAB, build_lm
from transformers import LlamaForCausalLM

from specroll.integrations.model_source import ModelPaths
from specroll.integrations.ray_backend.settings import ActorResources, ControllerConfig, SyncConfig, TopologyConfig
from specroll.online_drafter import LearnerConfig
from specroll.rollout import EngineConfig, SamplingParams


def tiny_llama(hidden: int, layers: int, seed: int) -> LlamaForCausalLM:
    return build_lm(vocab=VOCAB, hidden=hidden, layers=layers, seed=seed, logit_scale=1.0)


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
