"""SpecrollRolloutFunc inside a real TRL GRPOTrainer (2 steps, tiny demo recipe, in-process backend), and a
run stopped by a failed rollout."""

from __future__ import annotations

import copy
import os
import re
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")
from datasets import Dataset
from trl import GRPOTrainer
from trl_tiny import grpo_args, length_reward, tiny_model, tiny_tokenizer

from specroll.demo.model_cache import load_or_build_demo_models
from specroll.demo.recipe import DemoRecipe
from specroll.demo.task import make_prompts
from specroll.integrations.backend import RolloutError
from specroll.integrations.local_backend import LocalBackend
from specroll.integrations.trl_hook.rollout_func import SpecrollRolloutFunc, find_groups
from specroll.rollout import EngineConfig

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

class RecordingBackend(LocalBackend):
    """Counts generate calls so the test can check one call per rollout batch with n = G."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[int, int]] = []
        self.returned: list[list[int]] = []
        self.batches: list = []  # (rollouts, BatchStats) of each call

    def generate(self, prompts, params, n=1):
        self.calls.append((len(prompts), n))
        rollouts = super().generate(prompts, params, n)
        self.returned.extend(r.completion_ids for r in rollouts)
        self.batches.append((rollouts, self.batch_stats()))
        return rollouts


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_demo_cache):
    demo = load_or_build_demo_models(DemoRecipe.tiny(), cache_dir=tiny_demo_cache, progress=False)
    policy, tokenizer = demo.target, demo.tokenizer
    initial = {k: v.clone() for k, v in policy.state_dict().items()}
    backend = RecordingBackend.from_models(
        copy.deepcopy(policy), demo.drafter, EngineConfig(max_batch_size=8, max_seq_len=64, gamma=2),
    )
    seen: list[dict] = []

    def reward(prompts, completions, completion_ids, **kwargs):
        # The demo's exact-answer reward is ~always 0 on toy models (no gradient); length varies.
        seen.append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs))
        return length_reward(prompts, completions)

    between: list[tuple[int, int]] = []  # (trainer's step, engine's policy version) at each between_steps call
    holder: dict = {}
    rollout_func = SpecrollRolloutFunc(backend, between_steps=lambda: between.append(
        (holder["trainer"].state.global_step, backend.engine.policy_version)))
    trainer = holder["trainer"] = GRPOTrainer(
        model=policy, reward_funcs=reward, args=grpo_args(tmp_path_factory.mktemp("grpo")),
        train_dataset=Dataset.from_dict({"prompt": make_prompts(8, seed=0, max_digits=3)}),
        processing_class=tokenizer, rollout_func=rollout_func,
    )
    trainer.train()
    return dict(trainer=trainer, backend=backend, rollout_func=rollout_func, seen=seen, initial=initial,
                between=between)


def test_each_group_is_generated_once_with_n_equal_to_num_generations(trained):
    assert trained["backend"].calls == [(2, 2), (2, 2)]


def test_between_steps_runs_once_a_step_after_the_update_before_the_sync(trained):
    assert trained["between"] == [(0, 0), (1, 0)]  # step 1's call: updated to 1, the engine still at 0


def test_reward_sees_completions_in_trl_order_with_rollout_extras(trained):
    seen, backend = trained["seen"], trained["backend"]
    assert len(seen) == 2
    assert [ids for call in seen for ids in call["completion_ids"]] == backend.returned
    for call in seen:
        assert call["prompts"][0::2] == call["prompts"][1::2]  # G = 2 siblings share a prompt
        assert len(call["rollout_acceptance_rate"]) == len(call["completions"]) == 4
    assert [call["rollout_policy_version"] for call in seen] == [[0] * 4, [1] * 4]


def test_engine_holds_the_trainers_weights_after_train(trained):
    trainer, backend = trained["trainer"], trained["backend"]  # no manual sync: train() ends synced
    engine_params = dict(backend.engine.target.model.named_parameters())
    changed = 0
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(engine_params[name], param.detach(), rtol=0, atol=0)
        changed += not torch.equal(param.detach(), trained["initial"][name])
    assert changed == len(engine_params)  # the trainer updated every parameter, and each one arrived
    assert backend.engine.policy_version == trainer.state.global_step == 2


def test_rollout_metrics_reach_the_trainer_logs_with_the_backends_values(trained):
    steps = [e for e in trained["trainer"].state.log_history if "reward" in e]
    batches = trained["backend"].batches
    assert len(steps) == len(batches) == 2  # one rollout_func call, so one backend call, per step
    for entry, (rollouts, stats) in zip(steps, batches):
        assert entry["rollout/tokens"] == sum(len(r.completion_ids) for r in rollouts) == stats.generated_tokens
        drafted, accepted = sum(r.num_drafted for r in rollouts), sum(r.num_accepted for r in rollouts)
        assert entry["rollout/acceptance_rate"] == pytest.approx(accepted / drafted)
        assert entry["rollout/gamma"] == pytest.approx(stats.mean_gamma) and 0 < stats.mean_gamma <= 2
        assert entry["rollout/mean_accepted_len"] == pytest.approx(stats.mean_accepted_len)
        assert entry["rollout/live_rows"] == pytest.approx(stats.mean_live_rows)
        assert entry["rollout/tokens_per_s"] == pytest.approx(stats.tokens_per_s)
        assert entry["drafter/version"] == 0 and entry["weights/sync_s"] >= 0


def test_find_groups_falls_back_to_runs_when_prompts_are_not_repeated():
    assert find_groups([[1], [1], [2], [2]], 2) == [(0, 2), (2, 2)]
    assert find_groups([[1], [2], [2]], 2) == [(0, 1), (1, 2)]


def test_a_failed_rollout_stops_training_naming_its_prompt(tmp_path):
    tokenizer = tiny_tokenizer()
    policy = tiny_model(len(tokenizer), seed=0)
    seven = tokenizer.convert_tokens_to_ids("7")
    with torch.no_grad():  # any prompt holding "7" gets non-finite logits: its rollouts end in "error"
        policy.model.embed_tokens.weight[seven] = float("nan")
        # ... and no clean row may emit "7" itself (it would fail too): a zero logit never wins under top_k = 1,
        # whatever the sampler's random numbers.
        policy.lm_head.weight[seven] = 0.0
    backend = LocalBackend.from_models(copy.deepcopy(policy), None, EngineConfig(max_seq_len=32, gamma=0))
    trainer = GRPOTrainer(
        model=policy, reward_funcs=length_reward, args=grpo_args(tmp_path, max_steps=1, top_k=1),
        train_dataset=Dataset.from_dict({"prompt": ["1+2=", "7+7="]}), processing_class=tokenizer,
        rollout_func=SpecrollRolloutFunc(backend),
    )
    bad, clean = (tokenizer.decode(tokenizer(text)["input_ids"]) for text in ("7+7=", "1+2="))
    with pytest.raises(RolloutError, match=rf"2 of 4 rollouts .*prompt {re.escape(repr(bad))}") as raised:
        trainer.train()
    rollouts = raised.value.rollouts
    prompts = [tokenizer.decode(r.prompt_ids) for r in rollouts]
    assert sorted(prompts) == sorted([clean, clean, bad, bad])  # every entry came back, in the error
    assert raised.value.failed == [i for i, text in enumerate(prompts) if text == bad]
    assert all(r.finish_reason == "length" and len(r.completion_ids) == 6
               for r, text in zip(rollouts, prompts) if text == clean)


class MissedSyncBackend(LocalBackend):
    """A backend whose policy syncs never arrive: what a rank whose engine was not synced looks like."""

    def sync_policy(self, named_tensors, version):
        return 0.0


def test_rollouts_from_a_stale_policy_stop_training(tmp_path):
    tokenizer = tiny_tokenizer()
    policy = tiny_model(len(tokenizer), seed=0)
    backend = MissedSyncBackend.from_models(copy.deepcopy(policy), None, EngineConfig(max_seq_len=32, gamma=0))
    trainer = GRPOTrainer(
        model=policy, reward_funcs=length_reward, args=grpo_args(tmp_path, max_steps=2),
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{a}+{a}="}] for a in (1, 2)]}),
        processing_class=tokenizer, rollout_func=SpecrollRolloutFunc(backend),
    )
    stale = r"rank 0: rollouts from policy versions \[0\], but the trainer is at step 1"
    with pytest.raises(RuntimeError, match=stale):
        trainer.train()  # step 0 is served by the initial policy, as it should; step 1 is not


def test_every_rank_syncs_its_own_backend():
    tokenizer = tiny_tokenizer()
    policy = tiny_model(len(tokenizer), seed=0)
    backend = LocalBackend.from_models(tiny_model(len(tokenizer), seed=1), None, EngineConfig(max_seq_len=32, gamma=0))
    rank_1 = SimpleNamespace(  # not the main process, under a two-process launch
        model=policy, state=SimpleNamespace(global_step=3), _metrics=defaultdict(lambda: defaultdict(list)),
        accelerator=SimpleNamespace(unwrap_model=lambda m: m, is_main_process=False, num_processes=2),
    )
    SpecrollRolloutFunc(backend).sync_policy(rank_1)
    assert backend.engine.policy_version == 3
    engine_params = dict(backend.engine.target.model.named_parameters())
    for name, param in policy.named_parameters():
        assert torch.equal(engine_params[name], param.detach()), name
