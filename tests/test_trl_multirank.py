"""Two trainer ranks (`accelerate launch --multi_gpu --num_processes 2` on CPU, gloo), 3 GRPO steps.

- **Ray, one shared service**: rank 0 creates the rollout service in a run namespace of the session's
  Ray cluster (`shared_service.shared_controller`), rank 1 attaches. Every step the main rank syncs once
  and both ranks serve that step's policy; each rank gets exactly its own prompts × G completions; one
  set of workers and one learner exist (the named actors counted); the learner ran one round per step
  on both ranks' rollouts; the workers hold the trainer's weights after `train()`; the service's
  metrics are logged on rank 0 only.
- **`specroll train` on two processes** (the documented `accelerate launch ... -m specroll.cli train`,
  tiny demo recipe): rank 0 starts an embedded loopback cluster and the shared service, rank 1 joins
  it, and one report comes out.
- **LocalBackend, one per rank**: each rank serves its own engine, synced with the gathered weights
  every step (a LocalBackend cannot be shared between processes).

The hook raises on any rollout from another policy version than the step's, so a stale rank fails the
run. Two processes of GRPOTrainer take a minute or more on 2 cores: marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

STEPS = 3
ENTRIES = 4  # per rank and step: 2 prompts × G = 2 (trl_tiny.grpo_args)


def launch(out: Path, backend: str, port: int, env: dict[str, str] | None = None) -> tuple[list[dict], str]:
    """Both ranks' results, and the launch's stderr."""
    pytest.importorskip("trl")
    accelerate = Path(sys.executable).parent / "accelerate"
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1",
           **(env or {})}
    done = subprocess.run([str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port",
                           str(port), __file__, str(out), backend], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)], done.stderr


@pytest.mark.slow
def test_two_ranks_each_roll_out_from_the_current_policy(tmp_path):
    results, stderr = launch(tmp_path, "local", 29533)
    assert stderr.count("2 trainer ranks, each with its own LocalBackend") == 1, stderr[-4000:]  # main rank warns
    for rank, result in enumerate(results):
        assert result["versions_per_call"] == [[step] * ENTRIES for step in range(STEPS)], rank
        assert result["own_prompts"] == [True] * STEPS, rank
        assert result["engine_version"] == STEPS and result["mismatched"] == [], rank


@pytest.mark.slow
def test_two_ranks_share_one_ray_rollout_service(tmp_path, ray_cluster, tiny_model_paths):
    env = {"RAY_ADDRESS": ray_cluster.address, "SPECROLL_TEST_MODELS": json.dumps(tiny_model_paths)}
    results, stderr = launch(tmp_path, "ray", 29534, env)
    assert "each with its own" not in stderr
    for rank, result in enumerate(results):
        assert result["versions_per_call"] == [[step] * ENTRIES for step in range(STEPS)], rank
        assert result["own_prompts"] == [True] * STEPS, rank
        assert result["worker_versions"] == [STEPS, STEPS] and result["mismatched"] == [], rank
    main, other = results
    assert main["namespace"] == other["namespace"]
    assert main["named_actors"] == ["draft-learner", "rollout-worker-0", "rollout-worker-1", "weight-board"]
    assert main["learner"] == {"rollouts": 2 * STEPS * ENTRIES, "rounds": STEPS}
    assert main["service_metrics_logged"] and not other["service_metrics_logged"]
    assert other["rollout_metrics_logged"]


@pytest.mark.slow
def test_specroll_train_runs_on_two_processes(tmp_path, tiny_demo_cache):
    pytest.importorskip("trl")
    accelerate = Path(sys.executable).parent / "accelerate"
    config = Path(__file__).resolve().parents[1] / "configs" / "demo_tiny.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # as a user runs it: embedded Ray
    env.update(SPECROLL_CACHE=str(tiny_demo_cache), ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1")
    done = subprocess.run([str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port",
                           "29535", "-m", "specroll.cli", "train", "--config", str(config), "--out-dir",
                           str(tmp_path / "report")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("specroll: started an embedded Ray cluster") == 1, done.stdout
    assert done.stdout.count("specroll train: done in") == 1, done.stdout
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["steps"] == 2
    steps = [json.loads(line) for line in (tmp_path / "report" / "metrics.jsonl").read_text().splitlines()]
    assert [e["rollout/policy_version"] for e in steps if "reward" in e] == [0.0, 1.0]


def main(out: Path, backend_kind: str) -> None:
    import copy

    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    sys.path.insert(0, str(Path(__file__).parent))
    from trl_tiny import grpo_args, length_reward, tiny_model, tiny_tokenizer

    from specroll.integrations.trl_hook import SpecrollRolloutFunc
    from specroll.integrations.trl_hook.rollout_func import tokenize_prompts

    tokenizer = tiny_tokenizer()
    if backend_kind == "ray":
        from ray_helpers import make_config
        from transformers import AutoModelForCausalLM

        from specroll.integrations.ray_backend.shared_service import shared_controller
        from specroll.integrations.trl_hook.ranks import AccelerateRanks

        paths = json.loads(os.environ["SPECROLL_TEST_MODELS"])
        policy = AutoModelForCausalLM.from_pretrained(paths["target"])
        backend = shared_controller(make_config(paths, strategy=None, online_learning=True), AccelerateRanks(cpu=True))
    else:
        from specroll.integrations.local_backend import LocalBackend
        from specroll.rollout import EngineConfig

        policy = tiny_model(len(tokenizer), seed=0)
        backend = LocalBackend.from_models(copy.deepcopy(policy), None, EngineConfig(max_seq_len=32, gamma=0))
    seen: list[list[int]] = []
    own_prompts: list[bool] = []
    hook = SpecrollRolloutFunc(backend)

    def rollout_func(prompts, trainer):
        result = hook(prompts, trainer)
        own_prompts.append(result["prompt_ids"] == tokenize_prompts(prompts, trainer))
        return result

    def reward(prompts, completions, rollout_policy_version, **kwargs):
        seen.append(list(rollout_policy_version))
        return length_reward(prompts, completions)

    trainer = GRPOTrainer(
        model=policy, reward_funcs=reward, args=grpo_args(out / "trainer", max_steps=STEPS),
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{a}+{a}="}] for a in range(16)]}),
        processing_class=tokenizer, rollout_func=rollout_func,
    )
    rank = trainer.accelerator.process_index
    assert trainer.accelerator.num_processes == 2, trainer.accelerator.state  # TrainingArguments(use_cpu) → gloo
    trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model)
    result = {"versions_per_call": seen, "own_prompts": own_prompts}
    if backend_kind == "ray":
        result.update(ray_service_state(backend, model, trainer.state.log_history))
        trainer.accelerator.wait_for_everyone()  # rank 0's actors outlive every rank's reads
        backend.shutdown()
    else:
        engine = dict(backend.engine.target.model.named_parameters())
        result["engine_version"] = backend.engine.policy_version
        result["mismatched"] = [n for n, p in model.named_parameters() if not torch.equal(engine[n], p.detach())]
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def ray_service_state(controller, model, history: list[dict]) -> dict:
    import ray
    import torch

    from specroll.integrations.ray_backend.sync.protocol import unpack_buckets

    board = ray.get(controller.board.latest.remote())["policy"]
    served = unpack_buckets(board, [torch.from_numpy(a.copy()) for a in ray.get(list(board.route))])
    return {
        "namespace": controller.namespace,
        "named_actors": sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                               if a["namespace"] == controller.namespace),
        "learner": ray.get(controller.learner.counts.remote()),
        "worker_versions": [ray.get(w.versions.remote())["policy"] for w in controller.workers],
        "mismatched": [n for n, p in model.named_parameters() if not torch.equal(served[n], p.detach())],
        "service_metrics_logged": any("rollout/policy_version" in e for e in history),
        "rollout_metrics_logged": any("rollout/tokens" in e for e in history),
    }


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
