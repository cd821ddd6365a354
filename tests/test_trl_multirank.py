"""Two trainer ranks (`accelerate launch --multi_gpu --num_processes 2` on CPU, gloo): every rank's backend
serves the current policy at every step, and holds the trainer's weights after `train()`.

Each rank runs its own `SpecrollRolloutFunc` on its own `LocalBackend`; the hook raises on any rollout
from another policy version than the step's, so a rank whose backend missed a sync fails the run.
Two processes of GRPOTrainer start in about a minute on 2 cores: marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

STEPS = 3


@pytest.mark.slow
def test_two_ranks_each_roll_out_from_the_current_policy(tmp_path):
    pytest.importorskip("trl")
    accelerate = Path(sys.executable).parent / "accelerate"
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port",
                           "29533", __file__, str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, result in enumerate(results):
        assert result["versions_per_call"] == [[step] * 4 for step in range(STEPS)], rank
        assert result["engine_version"] == STEPS and result["mismatched"] == [], rank


def main(out: Path) -> None:
    import copy

    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    sys.path.insert(0, str(Path(__file__).parent))
    from trl_tiny import grpo_args, length_reward, tiny_model, tiny_tokenizer

    from specroll.integrations.local_backend import LocalBackend
    from specroll.integrations.trl_hook import SpecrollRolloutFunc
    from specroll.rollout import EngineConfig

    tokenizer = tiny_tokenizer()
    policy = tiny_model(len(tokenizer), seed=0)
    backend = LocalBackend.from_models(copy.deepcopy(policy), None, EngineConfig(max_seq_len=32, gamma=0))
    seen: list[list[int]] = []

    def reward(prompts, completions, rollout_policy_version, **kwargs):
        seen.append(list(rollout_policy_version))
        return length_reward(prompts, completions)

    trainer = GRPOTrainer(
        model=policy, reward_funcs=reward, args=grpo_args(out / "trainer", max_steps=STEPS),
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{a}+{a}="}] for a in range(16)]}),
        processing_class=tokenizer,
        rollout_func=SpecrollRolloutFunc(backend),
    )
    rank = trainer.accelerator.process_index
    assert trainer.accelerator.num_processes == 2, trainer.accelerator.state  # TrainingArguments(use_cpu) → gloo
    trainer.train()
    engine = dict(backend.engine.target.model.named_parameters())
    model = trainer.accelerator.unwrap_model(trainer.model)
    (out / f"rank{rank}.json").write_text(json.dumps({
        "versions_per_call": seen,
        "engine_version": backend.engine.policy_version,
        "mismatched": [n for n, p in model.named_parameters() if not torch.equal(engine[n], p.detach())],
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
