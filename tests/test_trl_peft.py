"""PEFT LoRA policies: the hook merges the adapter, sends the merged weights, and unmerges it."""

from __future__ import annotations

import copy
import os

import pytest
import torch

pytest.importorskip("peft")
from peft import LoraConfig
from trl import GRPOTrainer
from trl_tiny import grpo_args, length_reward, prompt_dataset, tiny_model, tiny_tokenizer

from specroll.integrations.local_backend import LocalBackend
from specroll.integrations.trl_hook.rollout_func import SpecrollRolloutFunc
from specroll.rollout import EngineConfig

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    tokenizer = tiny_tokenizer()
    policy = tiny_model(len(tokenizer), seed=0)
    backend = LocalBackend.from_models(
        copy.deepcopy(policy), None, EngineConfig(max_batch_size=8, max_seq_len=64, gamma=0),
    )
    rollout_func = SpecrollRolloutFunc(backend)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = GRPOTrainer(
        model=policy, reward_funcs=length_reward, args=grpo_args(tmp_path_factory.mktemp("lora")),
        train_dataset=prompt_dataset(), processing_class=tokenizer, rollout_func=rollout_func,
        peft_config=lora,
    )
    trainer.train()  # ends with a sync (the hook's train-end callback)
    return trainer, backend


def test_merged_lora_weights_reach_the_engine(lora_run):
    trainer, backend = lora_run
    merged = copy.deepcopy(trainer.model).merge_and_unload()
    engine_params = dict(backend.engine.target.model.named_parameters())
    assert set(engine_params) == {name for name, _ in merged.named_parameters()}
    for name, param in merged.named_parameters():
        torch.testing.assert_close(engine_params[name], param.detach(), rtol=0, atol=1e-6)
    q_name = "model.layers.0.self_attn.q_proj.weight"
    base = trainer.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert not torch.allclose(engine_params[q_name], base)  # the trained adapter moved q_proj


def test_adapter_is_unmerged_after_sync(lora_run):
    trainer, _ = lora_run
    lora_layers = [m for m in trainer.model.modules() if hasattr(m, "merged") and hasattr(m, "lora_A")]
    assert lora_layers
    assert not any(layer.merged for layer in lora_layers)
