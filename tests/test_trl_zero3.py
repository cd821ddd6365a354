"""DeepSpeed ZeRO-3 on CPU (gloo, one process): the hook's train-end sync sends the gathered full parameters.

DeepSpeed JIT-compiles a communication op the first time it initialises (~1–2 min), so the test is
marked slow. It runs the check in a child process (`python tests/test_trl_zero3.py`) because
`deepspeed.init_distributed` sets process-wide torch.distributed state the other tests must not see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.mark.slow
def test_zero3_train_end_sync_sends_the_gathered_full_parameters():
    pytest.importorskip("deepspeed")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29531", RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", TRL_EXPERIMENTAL_SILENCE="1")
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["partitioned_before"] and result["partitioned_after"]
    assert result["mismatched"] == []
    assert result["num_synced"] == result["num_params"] > 0
    assert result["policy_version"] == 7


def main() -> None:
    import deepspeed
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from trl_tiny import tiny_model

    from specroll.integrations.local_backend import LocalBackend
    from specroll.integrations.trl_hook.rollout_func import PolicySyncCallback, SpecrollRolloutFunc
    from specroll.rollout import EngineConfig

    deepspeed.init_distributed(dist_backend="gloo")
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
    }
    policy = tiny_model(48, seed=0)
    ds_engine, *_ = deepspeed.initialize(model=policy, config=config, model_parameters=policy.parameters())
    ids = torch.randint(3, 48, (1, 12))
    ds_engine.backward(ds_engine(input_ids=ids, labels=ids).loss)
    ds_engine.step()  # the shards moved away from the initial weights

    names = [name for name, _ in policy.named_parameters()]
    with deepspeed.zero.GatheredParameters(list(policy.parameters())):
        reference = {name: p.detach().clone() for name, p in policy.named_parameters()}
    backend = LocalBackend.from_models(tiny_model(48, seed=1), None, EngineConfig(max_seq_len=32, gamma=0))
    trainer = SimpleNamespace(
        model=policy, state=SimpleNamespace(global_step=7), _metrics=defaultdict(lambda: defaultdict(list)),
        accelerator=SimpleNamespace(unwrap_model=lambda m: m, is_main_process=True, num_processes=1),
    )
    partitioned_before = all(p.numel() == 0 for p in policy.parameters())
    PolicySyncCallback(SpecrollRolloutFunc(backend), trainer).on_train_end(None, trainer.state, None)
    engine_params = dict(backend.engine.target.model.named_parameters())
    print(json.dumps({
        "partitioned_before": partitioned_before,
        "partitioned_after": all(p.numel() == 0 for p in policy.parameters()),
        "mismatched": [n for n in names if not torch.equal(engine_params[n], reference[n])],
        "num_synced": sum(n in engine_params for n in names),
        "num_params": len(names),
        "policy_version": backend.engine.policy_version,
    }))


if __name__ == "__main__":
    main()
