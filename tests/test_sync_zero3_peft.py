"""DeepSpeed ZeRO-3 + PEFT LoRA on CPU (gloo, one process): the walk gathers one module at a time — never the
whole model — and its merged weights equal the whole-model gather-and-merge, leaving shards and adapter as
they were.

Slow (DeepSpeed's JIT build, ~1–2 min the first time); run in a child process (`python tests/test_sync_zero3_peft.py`)
because `deepspeed.init_distributed` sets process-wide torch.distributed state the other tests must not see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_zero3_lora_walk_gathers_module_by_module_and_merges_like_the_whole_model():
    pytest.importorskip("deepspeed")
    pytest.importorskip("peft")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["partitioned_before"] and result["partitioned_after"]
    assert result["num_names"] == result["num_reference"] > 0 and result["mismatched"] == []
    assert result["max_params_gathered_at_once"] <= result["largest_module_params"] < result["num_params"]
    assert result["max_merged_at_once"] == 1 and result["merged_after"] == 0
    assert result["max_abs_diff"] > 0  # the trained adapter moved the merged weights off the base


def main() -> None:
    import deepspeed
    import peft
    import torch
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_models import build_lm

    from specroll.integrations.trl_hook.policy_sync import iter_policy_weights

    deepspeed.init_distributed(dist_backend="gloo")
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
    }
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(build_lm(hidden=32, layers=2, seed=0), lora)
    ds_engine, *_ = deepspeed.initialize(model=model, config=config,
                                         model_parameters=[p for p in model.parameters() if p.requires_grad])
    ids = torch.randint(3, 64, (1, 12))
    ds_engine.backward(ds_engine(input_ids=ids, labels=ids).loss)
    ds_engine.step()  # lora_B moved off zero: merging now changes the base weights

    params = list(model.parameters())
    layers = [m for m in model.modules() if hasattr(m, "merged") and hasattr(m, "lora_A")]
    with deepspeed.zero.GatheredParameters(params):  # the reference: the whole model at once, merged
        base = {name: p.detach().clone() for name, p in model.named_parameters() if ".base_layer" in name}
        model.merge_adapter()
        reference = {name.removeprefix("base_model.model.").replace(".base_layer", ""): p.detach().clone()
                     for name, p in model.named_parameters() if "lora_" not in name}
        model.unmerge_adapter()
    partitioned_before = all(p.numel() == 0 for p in params)
    gathered_at_once, merged_at_once, names, mismatched, max_diff = [], [], [], [], 0.0
    for item in iter_policy_weights(model):
        gathered_at_once.append(sum(p.numel() for p in params if p.ds_status == ZeroParamStatus.AVAILABLE))
        merged_at_once.append(sum(layer.merged for layer in layers))
        names.append(item.name)
        if not torch.equal(item.tensor, reference[item.name]):
            mismatched.append(item.name)
        base_name = next((n for n in base if n.removeprefix("base_model.model.").replace(".base_layer", "")
                          == item.name), None)
        if base_name is not None:
            max_diff = max(max_diff, float((item.tensor - base[base_name]).abs().max()))
    largest = max(sum(p.ds_numel for p in m.parameters()) for m in layers)
    largest = max(largest, *(sum(p.ds_numel for p in m.parameters(recurse=False)) for m in model.modules()))
    print(json.dumps({
        "partitioned_before": partitioned_before,
        "partitioned_after": all(p.numel() == 0 for p in params),
        "num_names": len(set(names)), "num_reference": len(reference), "mismatched": mismatched,
        "max_params_gathered_at_once": max(gathered_at_once), "largest_module_params": largest,
        "num_params": sum(p.ds_numel for p in params),
        "max_merged_at_once": max(merged_at_once), "merged_after": sum(layer.merged for layer in layers),
        "max_abs_diff": max_diff,
    }))


if __name__ == "__main__":
    main()
