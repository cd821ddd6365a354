"""The length-grouped policy update (`trl_hook.length_groups`): the groups are the cheapest cut, and a real
TRL GRPOTrainer with it mixed in trains the same policy (same losses, same weights) over fewer token columns."""

from __future__ import annotations

import itertools
import json
import os
import random

import pytest
import torch

pytest.importorskip("trl")
from trl import GRPOTrainer
from trl_tiny import grpo_args, length_reward, prompt_dataset, tiny_model, tiny_tokenizer

from specroll.integrations.trl_hook import length_grouped
from specroll.integrations.trl_hook.length_groups import GROUP_OVERHEAD_TOKENS, length_groups

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

# Completion lengths of a long-tailed GRPO step: most short, one at the budget (EOS ends all but the longest).
LENGTHS = [3, 5, 2, 24, 4, 6, 3, 7]
MAX_COMPLETION = 24


def _work(groups, widths, prompt, overhead=GROUP_OVERHEAD_TOKENS):
    return sum(len(g) * (prompt + max(widths[i] for i in g)) + overhead for g in groups)


def test_groups_are_the_cheapest_consecutive_cut_of_the_sorted_rows():
    rng = random.Random(0)
    for _ in range(40):
        widths = [rng.choice([1, 2, 5, 9, 40, 300]) for _ in range(rng.randint(1, 7))]
        prompt, cap = rng.randint(0, 50), rng.randint(1, 7)
        groups = length_groups(widths, prompt, cap)
        assert sorted(i for g in groups for i in g) == list(range(len(widths)))
        assert all(1 <= len(g) <= cap for g in groups)
        order = sorted(range(len(widths)), key=lambda i: -widths[i])
        best = min(_work([order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)))], widths, prompt)
                   for k in range(len(order)) for cuts in itertools.combinations(range(1, len(order)), k)
                   if all(b - a <= cap for a, b in zip((0, *cuts), (*cuts, len(order)))))
        assert _work(groups, widths, prompt) == best
    assert length_groups([], 3) == []
    with pytest.raises(ValueError, match="max_rows"):
        length_groups([1, 2], 3, max_rows=-1)


def _rollout(tokenizer):
    """A fixed rollout function (TRL's `rollout_func`): the same long-tailed completions for every call."""

    def rollout(prompts, trainer):
        prompt_ids, completion_ids = [], []
        for index, prompt in enumerate(prompts):
            text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            prompt_ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
            length = LENGTHS[index % len(LENGTHS)]
            body = [4 + (7 * index + 3 * t) % 36 for t in range(length)]
            completion_ids.append(body if length == MAX_COMPLETION else [*body[:-1], tokenizer.eos_token_id])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
                "logprobs": [[0.0] * len(c) for c in completion_ids]}

    return rollout


def _train(tmp_path, trainer_class):
    tokenizer = tiny_tokenizer()
    policy = tiny_model(len(tokenizer), seed=3)
    columns = []
    policy.register_forward_pre_hook(lambda module, args, kwargs: columns.append(kwargs["input_ids"].numel()),
                                     with_kwargs=True)
    trainer = trainer_class(
        model=policy, reward_funcs=length_reward, train_dataset=prompt_dataset(), processing_class=tokenizer,
        rollout_func=_rollout(tokenizer),
        # SGD: the weights then differ by lr x the gradients' rounding; Adam would turn a near-zero gradient's
        # rounding into a whole step of either sign
        args=grpo_args(tmp_path, per_device_train_batch_size=8, num_generations=4,
                       max_completion_length=MAX_COMPLETION, max_steps=3, optim="sgd"),
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}, losses, sum(columns)


def test_length_grouped_trainer_trains_the_same_policy_over_fewer_token_columns(tmp_path):
    plain_weights, plain_losses, plain_columns = _train(tmp_path / "plain", GRPOTrainer)
    grouped_weights, grouped_losses, grouped_columns = _train(tmp_path / "grouped", length_grouped(GRPOTrainer))
    initial = tiny_model(len(tiny_tokenizer()), seed=3).state_dict()
    assert any(not torch.equal(plain_weights[k], initial[k]) for k in initial)  # the update moved the policy
    assert len(plain_losses) == len(grouped_losses) == 3
    assert grouped_losses == pytest.approx(plain_losses, rel=1e-4, abs=1e-6)
    for name, value in plain_weights.items():
        torch.testing.assert_close(grouped_weights[name], value, rtol=1e-4, atol=1e-6, msg=name)
    assert grouped_columns < 0.75 * plain_columns


def test_update_cost_benchmark_times_both_trainers_on_fixed_completions(study, tmp_path):
    from types import SimpleNamespace

    update_cost = study("update_cost")

    tokenizer = tiny_tokenizer()
    messages = list(prompt_dataset()["prompt"][:2])
    prompt_ids = [tokenizer(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False)["input_ids"] for m in messages]
    completions = [[[5, 6, 2], [7, 2]], [[8, 9, 10, 11], [12, 2]]]
    rollout = update_cost.fixed_rollout(prompt_ids, completions, [json.dumps(m) for m in messages])
    out = rollout([messages[1], messages[0], messages[1]], None)
    assert out["completion_ids"] == [[8, 9, 10, 11], [5, 6, 2], [12, 2]]  # the k-th occurrence: the k-th sample
    args = SimpleNamespace(generations=2, max_new_tokens=4, steps=2)
    for trainer_class in (GRPOTrainer, length_grouped(GRPOTrainer)):
        times = update_cost.step_times(trainer_class, tiny_model(len(tokenizer), seed=0), tokenizer, messages, rollout,
                                       args, str(tmp_path / trainer_class.__name__))
        assert len(times) == 2 and all(t > 0 for t in times)


def test_ranks_that_gather_parameters_in_every_forward_keep_trls_path():
    from types import SimpleNamespace

    from specroll.integrations.trl_hook.length_groups import sharded_forward

    def trainer(processes, stage=None, fsdp=False):
        plugin = None if stage is None else SimpleNamespace(zero_stage=stage)
        return SimpleNamespace(is_fsdp_enabled=fsdp, accelerator=SimpleNamespace(
            num_processes=processes, state=SimpleNamespace(deepspeed_plugin=plugin)))

    assert sharded_forward(trainer(2, stage=3)) and sharded_forward(trainer(4, fsdp=True))
    assert not sharded_forward(trainer(1, stage=3))  # one rank: nothing to keep in step with
    assert not sharded_forward(trainer(2, stage=2)) and not sharded_forward(trainer(2))
