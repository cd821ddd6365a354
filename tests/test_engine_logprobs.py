"""Rollout logprobs equal a separate full forward of the target over prompt + completion.

The reference processes the full-forward logits with Hugging Face's own logits warpers
(temperature, then top-k, then top-p — independent of the engine's code); for greedy runs it is the
raw log-softmax. Tolerance 1e-5 in fp32. Runs use a partly agreeing drafter and fewer slots than
prompts, so logprobs come from verify forwards at every draft offset and from refilled slots.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_prompts, noisy_copy, tiny_lm
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

PROMPTS = make_prompts(12, 1, 8, seed=5)


def reference_logprobs(model, prompt: list[int], completion: list[int], params: SamplingParams) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]  # [T, V]
    if params.temperature > 0:
        logits = TemperatureLogitsWarper(params.temperature)(None, logits)
        if params.top_k:
            logits = TopKLogitsWarper(params.top_k)(None, logits)
        if params.top_p < 1.0:
            logits = TopPLogitsWarper(params.top_p)(None, logits)
    return logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


@pytest.mark.parametrize(
    ("params", "gamma"),
    [
        (SamplingParams(16, temperature=0), 3),
        (SamplingParams(16, temperature=0.7, seed=0), 3),
        (SamplingParams(16, temperature=1.5, top_k=8, seed=1), 2),
        (SamplingParams(16, temperature=1.2, top_p=0.9, seed=2), 4),
        (SamplingParams(16, temperature=1.0, seed=3), 0),
    ],
    ids=["greedy", "T0.7", "T1.5-topk8", "T1.2-topp0.9", "plain-T1.0"],
)
def test_logprobs_equal_full_forward(params, gamma):
    target = tiny_lm("llama", "sdpa")
    config = EngineConfig(max_batch_size=5, max_seq_len=32, gamma=gamma)
    engine = SpecEngine(target, noisy_copy("llama", "sdpa"), config)
    rollouts = engine.generate(PROMPTS, params)
    for r in rollouts:
        assert len(r.logprobs) == len(r.completion_ids) == 16
        expected = reference_logprobs(target, r.prompt_ids, r.completion_ids, params)
        torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-5, rtol=0)
