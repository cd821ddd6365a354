"""A bf16 engine keeps the rotary frequencies fp32, as HF and the trainer do (`models.weights.cast_module`):
cast to bf16 they put angle errors that grow with position into every rollout logprob."""

from __future__ import annotations

import torch
from tiny_models import build_lm

from specroll.rollout import EngineConfig, SpecEngine
from specroll.rollout.drafters.heads import EagleHead


def inv_freqs(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: b for name, b in module.named_buffers() if name.endswith("inv_freq")}


def test_a_bf16_engine_keeps_the_targets_and_the_heads_rotary_frequencies_in_fp32():
    target = build_lm("llama", "sdpa", hidden=64, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    head = EagleHead.for_target(target.config, seed=1)
    expected = {**{f"target.{n}": b.clone() for n, b in inv_freqs(target).items()},
                **{f"head.{n}": b.clone() for n, b in inv_freqs(head).items()}}
    assert expected and all(b.dtype == torch.float32 for b in expected.values())
    # the failure this guards against is real at this shape: bf16 frequencies, angles off by ~1 rad at position 8k
    worst = max((8191 * (b - b.to(torch.bfloat16).float())).abs().max() for b in expected.values())
    assert worst > 0.5, worst
    engine = SpecEngine(target, head, EngineConfig(dtype="bfloat16", drafters=("eagle",), max_batch_size=2,
                                                   max_seq_len=32, gamma=2))
    assert engine.target.model.lm_head.weight.dtype == torch.bfloat16  # the weights are cast ...
    served = {**{f"target.{n}": b for n, b in inv_freqs(engine.target.model).items()},
              **{f"head.{n}": b for n, b in inv_freqs(engine.drafter.head).items()}}
    assert served.keys() == expected.keys()
    for name, buffer in served.items():  # ... the rotary frequencies are not
        assert buffer.dtype == torch.float32 and torch.equal(buffer, expected[name]), name
