"""An EAGLE-3 head trained online on vLLM rollouts (`VllmBackend.from_models` with an `Eagle3Head`), through a real
TRL GRPOTrainer with `learner.signals: trainer`: the learner's signals (top-k p and the head's fused layers' hidden
states) come from TRL's own loss forward (the probe's from a forward of the policy copy: no trainer forward sees
them), learner rounds run on them, and every published head is served by vLLM's
EAGLE-3 proposer (each worker reports the published version's digest, in the speculators layout); speculating with
it keeps greedy decoding exact. One vLLM start on a 4-layer fp32 Llama of heads of 64 (vLLM's CPU attention), the
TRL tests' character tokenizer; slow (~30 s). (`learner.signals: forward` records the same signals with
`TargetSignals`: tests/test_trainer_signals.py compares it with the engine's; a second EAGLE-3 vLLM start in one
process after the first engine is gone fails inside vLLM — "tensor model parallel group is not initialized".)"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("trl")

from tiny_models import build_lm
from trl import GRPOTrainer
from trl_tiny import grpo_args, length_reward, prompt_dataset, tiny_tokenizer

from specroll.integrations.learner_schedule import ProbeSet
from specroll.integrations.trl_hook.rollout_func import SpecrollRolloutFunc
from specroll.integrations.vllm.backend import VllmBackend
from specroll.integrations.vllm.settings import VllmSettings
from specroll.online_drafter import LearnerConfig
from specroll.rollout import EngineConfig, SamplingParams
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
SHAPE = dict(hidden=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64, logit_scale=6,
             max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.mark.slow
def test_an_eagle3_head_trains_on_trainer_signals_and_each_version_is_served_by_vllm(tmp_path):
    tokenizer = tiny_tokenizer()
    policy = build_lm("llama", "eager", vocab=len(tokenizer), layers=4, seed=3, **SHAPE)
    target = build_lm("llama", "eager", vocab=len(tokenizer), layers=4, seed=3, **SHAPE)
    head = Eagle3Head.for_target(target.config, layers=(0, 2, 3), seed=1, ttt_steps=1)
    learner = LearnerConfig(max_steps=4, batch_size=4, holdout_fraction=0.5, lr=3e-3, gate_z=0.0, warmup_steps=0,
                            ema_decay=0.0, signals="trainer")
    backend = VllmBackend.from_models(target, head, EngineConfig(max_batch_size=16, max_seq_len=64, gamma=2),
                                      learner, settings=VllmSettings(kv_cache_gib=1))
    assert backend.trainer_signals().capture_layers == (0, 2, 3)
    probe = ProbeSet([[{"role": "user", "content": f"{a}+{a}="}] for a in (11, 12)], every=1)
    func = SpecrollRolloutFunc(backend, probe=probe)
    trainer = GRPOTrainer(model=policy, reward_funcs=length_reward, args=grpo_args(tmp_path, max_steps=4),
                          train_dataset=prompt_dataset(), processing_class=tokenizer, rollout_func=func)
    trainer.train()
    history = trainer.state.log_history
    assert [e["signals/captured"] for e in history if "signals/captured" in e] == [4.0, 4.0, 4.0]
    assert sum(e.get("drafter/num_steps", 0) for e in history) > 0  # rounds trained on the captured signals
    assert any("drafter/probe_policy_version" in e for e in history)  # probes, their signals from TargetSignals
    assert backend.learner.version >= 1  # a head was published …
    served = backend.engine.served_drafter_digests()
    assert served == [backend._published().digest()]  # … and vLLM's EAGLE-3 proposer serves it
    assert backend.engine.drafter_version == backend.learner.version
    prompts = [[1, 5, 6, 7], [1, 9, 8]]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    rollouts = backend.generate(prompts, greedy, n=1)
    assert [r.completion_ids for r in rollouts] == [hf_greedy(target, p, 8) for p in prompts]


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(new_tokens):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[0, len(prompt):].tolist()
