"""The lean forward (`rollout.models.lean`) computes what HF's forward computes, on the same weights.

Covered: Llama, Qwen2 (q/k/v biases, here made non-zero) and Qwen3 (per-head q/k norms, here
perturbed), grouped-query attention, one and several query tokens per row, ragged starts,
`logits_at`, weight updates in place after fusing, and parameters rebound behind its back. The
engine-level greedy tests (`test_engine_greedy.py`) run through it too for every sdpa model.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.models.lean import unfuse, unsupported_reason
from specroll.rollout.models.runner import ModelRunner
from specroll.rollout.models.weights import copy_into

ATOL = 1e-5


def perturbed(arch: str, seed: int = 0):
    """A tiny model whose biases and norm weights are random (HF initialises them to 0 / 1)."""
    model = build_lm(arch, "sdpa", logit_scale=1.0, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    return model


def hf_logits(model, rows: list[list[int]]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(torch.tensor([r])).logits[0] for r in rows]


def runner_for(model, lean: bool = True) -> ModelRunner:
    return ModelRunner(model, batch=4, length=48, dtype=torch.float32, device=torch.device("cpu"), lean=lean)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_lean_matches_hf_forward(arch):
    model = perturbed(arch)
    runner = runner_for(model)
    assert runner.lean is not None, unsupported_reason(model)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([7, 3, 11])
    tokens = torch.randint(64, (3, 16), generator=gen)
    live = slice(0, 3)
    last = runner.extend(live, tokens, lengths)  # ragged prefill, logits at each row's last token
    rows = [tokens[b, : int(n)].tolist() for b, n in enumerate(lengths)]
    for b, expected in enumerate(hf_logits(model, rows)):
        torch.testing.assert_close(last[b], expected[-1], atol=ATOL, rtol=0)
    for width in (1, 4):  # one query token (packed GQA path) and several (repeated K/V)
        new = torch.randint(64, (3, width), generator=gen)
        logits = runner.feed(live, new)
        rows = [r + new[b].tolist() for b, r in enumerate(rows)]
        for b, expected in enumerate(hf_logits(model, rows)):
            torch.testing.assert_close(logits[b], expected[-width:], atol=ATOL, rtol=0)


def test_lean_sees_in_place_weight_updates_and_rebinds():
    model = perturbed("qwen2")
    runner = runner_for(model)
    other = perturbed("qwen2", seed=5)
    copy_into(model, dict(other.named_parameters()), "target")  # what SpecEngine.update_target does
    tokens = torch.randint(64, (1, 9), generator=torch.Generator().manual_seed(2))
    got = runner.extend(slice(0, 1), tokens, torch.tensor([9]))
    torch.testing.assert_close(got[0], hf_logits(other, [tokens[0].tolist()])[0][-1], atol=ATOL, rtol=0)

    # Rebinding every parameter (a dtype round trip makes new tensors) must not leave stale fused weights.
    model.to(torch.float64).to(torch.float32)
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
    runner.rollback(slice(None), torch.zeros_like(runner.cache.lens))
    got = runner.extend(slice(0, 1), tokens, torch.tensor([9]))
    torch.testing.assert_close(got[0], hf_logits(model, [tokens[0].tolist()])[0][-1], atol=ATOL, rtol=0)


def test_a_tied_lm_head_stays_tied_and_follows_a_policy_update():
    """On CPU the lean forward stores the LM head K-major; a tied embedding must remain the same parameter, so a
    policy update (which names the tied weight once) writes both."""
    model = build_lm("qwen2", "sdpa", tie_word_embeddings=True, seed=3)
    runner = runner_for(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight and not model.lm_head.weight.is_contiguous()
    other = build_lm("qwen2", "sdpa", tie_word_embeddings=True, seed=4)
    copy_into(model, dict(other.named_parameters()), "target")
    tokens = torch.randint(64, (1, 9), generator=torch.Generator().manual_seed(2))
    got = runner.extend(slice(0, 1), tokens, torch.tensor([9]))
    torch.testing.assert_close(got[0], hf_logits(other, [tokens[0].tolist()])[0][-1], atol=ATOL, rtol=0)


def test_unsupported_models_use_hf_forward():
    assert unsupported_reason(build_lm("llama", "eager")) is not None
    assert runner_for(build_lm("llama", "eager")).lean is None
    assert runner_for(build_lm("llama", "sdpa"), lean=False).lean is None


def test_engine_output_is_the_same_with_and_without_lean_forward():
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    params = SamplingParams(max_new_tokens=12, temperature=0.8, seed=11)
    outputs = []
    for lean in (True, False):
        config = EngineConfig(max_batch_size=2, max_seq_len=32, gamma=3, lean_forward=lean)
        engine = SpecEngine(build_lm("qwen3", "sdpa"), build_lm("qwen3", "sdpa", seed=3), config)
        assert (engine.target.lean is not None) is lean
        outputs.append([r.completion_ids for r in engine.generate(prompts, params)])
    assert outputs[0] == outputs[1]


def test_unfuse_lets_a_model_be_saved_after_the_engine_ran_it(tmp_path):
    model = perturbed("llama")
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    runner_for(model).extend(slice(0, 1), torch.tensor([[1, 2, 3]]), torch.tensor([3]))
    unfuse(model)
    model.save_pretrained(tmp_path)
    saved = type(model).from_pretrained(tmp_path)
    for name, value in saved.state_dict().items():
        torch.testing.assert_close(value, expected[name], atol=0, rtol=0)
