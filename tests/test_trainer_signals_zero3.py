"""DeepSpeed ZeRO-3 on CPU (gloo, one process): `learner.signals: trainer` captures under partitioned parameters —
the LM head gathered for the projection as TRL's fused head gathers it — the same signals (top-k p, EAGLE-3 layers'
hidden states) as the unpartitioned policy gives, through TRL's fused-head loss forward.

Slow (DeepSpeed JIT-compiles a communication op at its first start, ~1–2 min); run in a child process
(`python tests/test_trainer_signals_zero3.py`), as tests/test_trl_zero3.py is, so that `deepspeed.init_distributed`'s
process-wide state stays out of the other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_zero3_trainer_signals_equal_the_unpartitioned_policys():
    pytest.importorskip("deepspeed")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", TRL_EXPERIMENTAL_SILENCE="1")
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["partitioned"] and result["captured"] == result["expected"] == 6
    assert result["max_prob_diff"] < 1e-5 and result["ids_equal"] and result["max_hidden_diff"] < 2e-3


def capture_signals(model, forward, rollouts, params):
    from specroll.integrations.signal_source import SignalRequest
    from specroll.integrations.trl_hook.signal_capture import TrainerSignalCapture
    from specroll.tools.signal_cost import grpo_rows

    capture = TrainerSignalCapture(SignalRequest(8, hidden=True, capture_layers=(0, 2, 3)))
    capture.expect(rollouts, params, 0)
    ids, mask, width = grpo_rows(rollouts, pad_id=0)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :width] = -100
    with capture.watching(model, width):
        forward(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return capture.take()


def main() -> None:
    import copy

    import deepspeed
    import torch
    from transformers.integrations import HfDeepSpeedConfig
    from trl.trainer.utils import add_fused_lm_head

    sys.path.insert(0, str(Path(__file__).parent))
    from trl_tiny import tiny_model

    from specroll.rollout import Rollout, SamplingParams

    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
    policy = tiny_model(48, seed=0, layers=4)
    reference = copy.deepcopy(policy)
    for model in (policy, reference):
        add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
    gen = torch.Generator().manual_seed(0)
    rollouts = [Rollout(prompt_ids=torch.randint(3, 48, (p,), generator=gen).tolist(),
                        completion_ids=torch.randint(3, 48, (c,), generator=gen).tolist(), logprobs=[0.0] * c,
                        finish_reason="length") for p, c in ((4, 6), (7, 3), (2, 5), (5, 5), (3, 1), (6, 4))]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, top_k=12)
    theirs = capture_signals(reference, reference, rollouts, params)  # before ZeRO-3 is on: then every model is in it
    keep = HfDeepSpeedConfig(config)  # what accelerate sets under ZeRO-3: TRL's lm-head gather looks for it
    ds_engine, *_ = deepspeed.initialize(model=policy, config=config, model_parameters=policy.parameters())
    ours = capture_signals(policy, ds_engine, rollouts, params)
    print(json.dumps({
        "partitioned": all(p.numel() == 0 for p in policy.parameters()),
        "expected": len(rollouts), "captured": len(ours),
        "max_prob_diff": max(float((a.signals.topk_probs - b.signals.topk_probs).abs().max())
                             for a, b in zip(ours, theirs)),
        "ids_equal": all(torch.equal(a.signals.topk_ids[b.signals.topk_probs > 1e-6],
                                     b.signals.topk_ids[b.signals.topk_probs > 1e-6]) for a, b in zip(ours, theirs)),
        "max_hidden_diff": max(float((a.signals.hidden.float() - b.signals.hidden.float()).abs().max())
                               for a, b in zip(ours, theirs)),
    }))
    del keep


if __name__ == "__main__":
    main()
