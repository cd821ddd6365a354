"""`learner.signals: trainer`: the learner's signals captured in TRL's own GRPO loss forward (`trl_hook.signal_capture`)
equal what specroll's engine records for the same rollouts — the top-k ids and processed probabilities, and for an
EAGLE-3 head the captured layers' hidden states — under gradient accumulation (shuffled micro-batches, or a
generation per micro-batch) and num_iterations > 1 (the later iterations' forwards are another policy's: not
taken), and under PEFT (the adapted policy's); a GRPO run with it trains the learner, probes included; and the
settings it cannot work under are refused, naming them. The "forward" source (`TargetSignals`, an extra forward of
the policy) records the engine's signals too. Tiny fp32 models (tests/trl_tiny.py)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

pytest.importorskip("trl")
from trl import GRPOTrainer
from trl_tiny import grpo_args, length_reward, prompt_dataset, tiny_model, tiny_tokenizer

from specroll.integrations.learner_schedule import ProbeSet
from specroll.integrations.local_backend import LocalBackend
from specroll.integrations.signal_source import SignalRequest, resolve_source
from specroll.integrations.trl_hook.rollout_func import SpecrollRolloutFunc
from specroll.integrations.vllm.signals import TargetSignals
from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.online_learner import make_online_learner
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
LEARNER = LearnerConfig(max_steps=2, batch_size=4, holdout_fraction=0.5, signals="trainer")


class BothSources(LocalBackend):
    """An engine that records signals, behind a backend that takes the trainer's: both kept for comparison."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generated: list = []
        self.handed: list = []

    def generate(self, prompts, params, n=1):
        rollouts = super().generate(prompts, params, n)
        self.generated.extend(rollouts)
        return rollouts

    def add_trainer_signals(self, rollouts):
        self.handed.extend(rollouts)
        super().add_trainer_signals(rollouts)


def run(tmp_path, backend, steps=2, peft_config=None, probe=None, **overrides):
    tokenizer = tiny_tokenizer()
    func = SpecrollRolloutFunc(backend, probe=probe)
    trainer = GRPOTrainer(model=tiny_model(len(tokenizer), seed=0, layers=4), reward_funcs=length_reward,
                          args=grpo_args(tmp_path, max_steps=steps, **overrides), train_dataset=prompt_dataset(),
                          processing_class=tokenizer, rollout_func=func, peft_config=peft_config)
    trainer.train()
    return trainer, func


def both_sources(drafter, request: SignalRequest, drafters=None) -> BothSources:
    vocab = len(tiny_tokenizer())
    target = tiny_model(vocab, seed=0, layers=4)
    config = EngineConfig(max_batch_size=8, max_seq_len=64, gamma=2, record_signals=True, signal_top_k=request.top_k,
                          drafters=drafters)
    learner = make_online_learner(drafter, target, LEARNER)
    return BothSources(SpecEngine(target, drafter, config), learner, drafter, request)


def check_equal(backend: BothSources, handed) -> None:
    recorded = {(tuple(r.prompt_ids), tuple(r.completion_ids)): r.signals for r in backend.generated}
    assert handed
    for r in handed:
        engine = recorded[(tuple(r.prompt_ids), tuple(r.completion_ids))]
        torch.testing.assert_close(r.signals.topk_probs, engine.topk_probs, atol=1e-5, rtol=1e-4)
        positive = engine.topk_probs > 1e-6  # the order of zero-probability ids is arbitrary
        assert torch.equal(r.signals.topk_ids[positive], engine.topk_ids.long()[positive])
        if engine.hidden is not None:
            torch.testing.assert_close(r.signals.hidden.float(), engine.hidden.float(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("overrides", [dict(gradient_accumulation_steps=2), dict(num_iterations=2),
                                       dict(gradient_accumulation_steps=2, steps_per_generation=1)],
                         ids=["grad_accum", "iterations", "generation_per_micro_batch"])
def test_trainer_signals_equal_the_engines_for_the_same_rollouts(tmp_path, overrides):
    backend = both_sources(tiny_model(len(tiny_tokenizer()), seed=1, layers=1), SignalRequest(top_k=8))
    _, func = run(tmp_path, backend, top_k=12, **overrides)
    last = func.capture.take()  # the last step's, which no later call handed on
    assert func.capture.missed == 0 and len(backend.handed) + len(last) == len(backend.generated)
    check_equal(backend, backend.handed + last)


def test_under_peft_the_signals_are_the_adapted_policys_not_the_references(tmp_path):
    peft = pytest.importorskip("peft")
    backend = both_sources(tiny_model(len(tiny_tokenizer()), seed=1, layers=1), SignalRequest(top_k=8))
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    _, func = run(tmp_path, backend, steps=3, beta=0.04, peft_config=lora)  # beta: TRL's reference pass runs too
    assert func.capture.missed == 0
    check_equal(backend, backend.handed[-4:])  # step 1's: the adapter had moved, the engine has it merged


def test_trainer_signals_carry_eagle3_hidden_states_as_the_engine_records_them(tmp_path):
    vocab = len(tiny_tokenizer())
    head = Eagle3Head.for_target(tiny_model(vocab, seed=0, layers=4).config, layers=(0, 2, 3), seed=2, ttt_steps=1)
    request = SignalRequest(top_k=8, hidden=True, capture_layers=(0, 2, 3))
    backend = both_sources(head, request, drafters=("eagle3",))
    _, func = run(tmp_path, backend, steps=1)
    check_equal(backend, func.capture.take())


def test_a_grpo_run_with_trainer_signals_trains_the_learner(tmp_path):
    vocab = len(tiny_tokenizer())
    backend = LocalBackend.from_models(tiny_model(vocab, seed=0, layers=4), tiny_model(vocab, seed=1, layers=1),
                                       EngineConfig(max_batch_size=8, max_seq_len=64, gamma=2), LEARNER)
    probe = ProbeSet([[{"role": "user", "content": f"{a}+{a}="}] for a in (11, 12)], every=1)
    trainer, _ = run(tmp_path, backend, steps=3, probe=probe)
    history = trainer.state.log_history
    assert [entry["signals/captured"] for entry in history if "signals/captured" in entry] == [4.0, 4.0]
    assert sum(entry.get("drafter/num_steps", 0) for entry in history) > 0  # rounds trained
    assert any("drafter/probe_policy_version" in entry for entry in history)  # the probe's rollouts have signals


def test_settings_the_capture_cannot_work_under_are_refused_naming_them(tmp_path):
    vocab = len(tiny_tokenizer())
    backend = LocalBackend.from_models(tiny_model(vocab, seed=0, layers=4), tiny_model(vocab, seed=1, layers=1),
                                       EngineConfig(max_batch_size=8, max_seq_len=64, gamma=2), LEARNER)
    with pytest.raises(ValueError, match="steps_per_generation"):
        run(tmp_path, backend, steps_per_generation=2)
    with pytest.raises(ValueError, match=r"learner\.signals='forward'.*specroll"):
        resolve_source("forward", "specroll")
    with pytest.raises(ValueError, match=r"learner\.signals='engine'.*vllm"):
        resolve_source("engine", "vllm")
    with pytest.raises(ValueError, match="signals"):
        LearnerConfig(signals="policy")


def test_the_forward_source_records_what_the_engine_records_eagle3_hidden_states_included():
    vocab = len(tiny_tokenizer())
    target = tiny_model(vocab, seed=0, layers=4)
    head = Eagle3Head.for_target(target.config, layers=(0, 2, 3), seed=2, ttt_steps=1)
    engine = SpecEngine(target, head, EngineConfig(max_batch_size=8, max_seq_len=64, gamma=2, record_signals=True,
                                                   signal_top_k=8, drafters=("eagle3",)))
    params = SamplingParams(max_new_tokens=6, temperature=1.0, top_k=12, seed=3)
    recorded = engine.generate([[1, 5, 6, 7], [1, 9, 8], [1, 20, 21, 22, 23]], params, n=2)
    copies = [dataclasses.replace(r, signals=None) for r in recorded]
    TargetSignals(target, 8, capture_layers=(0, 2, 3)).record(copies, params)
    backend = BothSources(engine, None)
    backend.generated = recorded
    check_equal(backend, copies)
