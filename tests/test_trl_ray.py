"""SpecrollRolloutFunc over the Ray controller in a real GRPOTrainer: after `train()` the workers hold
the trainer's final policy, with no manual sync."""

from __future__ import annotations

import os

import pytest
import ray
import torch

pytest.importorskip("trl")
from tiny_models import VOCAB
from transformers import AutoModelForCausalLM
from trl import GRPOTrainer
from trl_tiny import grpo_args, length_reward, prompt_dataset, tiny_tokenizer

from specroll.integrations.ray_backend.sync.protocol import unpack_buckets
from specroll.integrations.trl_hook.rollout_func import SpecrollRolloutFunc

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def test_workers_hold_the_trainers_weights_after_train(controller, tiny_model_paths, tmp_path):
    tokenizer = tiny_tokenizer()
    assert len(tokenizer) <= VOCAB
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_paths["target"])
    initial = {name: p.detach().clone() for name, p in policy.named_parameters()}
    trainer = GRPOTrainer(
        model=policy, reward_funcs=length_reward, args=grpo_args(tmp_path),
        train_dataset=prompt_dataset(), processing_class=tokenizer,
        rollout_func=SpecrollRolloutFunc(controller, learn=False),
    )
    trainer.train()
    assert [ray.get(w.versions.remote())["policy"] for w in controller.workers] == [trainer.state.global_step] * 2
    board = ray.get(controller.board.latest.remote())["policy"]  # what every worker committed
    served = unpack_buckets(board, [torch.from_numpy(a.copy()) for a in ray.get(list(board.route))])
    for name, param in trainer.model.named_parameters():
        assert torch.equal(served[name], param.detach()), name
    assert not all(torch.equal(p.detach(), initial[n]) for n, p in trainer.model.named_parameters())
