"""Drafter kinds served by vLLM's proposers, exact under greedy decoding. An EAGLE-3 head written in the
speculators layout (`formats.eagle3.save_eagle3_checkpoint`, what `specroll train` / `distill` / `export` write)
loads in vLLM's EAGLE-3 proposer through `VllmEngine` (drafters: [eagle3]), refits in place through the worker
extension, and vLLM's greedy output with it equals vLLM's plain greedy output, ragged prompts, n = 2 (an 8-layer
fp32 Llama: EAGLE-3 fuses three of its layers). The suffix kind on vLLM's n-gram proposer: greedy output equal to
plain, on prompts that repeat themselves (so prompt lookup drafts). Slow: two vLLM starts each.

Distribution, each served kind: at T = 1 and at T = 0.7 with top-k 8, the tokens vLLM emits while speculating
follow the target's processed distribution — the conditional χ² of `distribution_stats` (exact p_t from one Hugging
Face forward of the target), 12,000 sampled tokens, α = 1e-3; each test also checks that drafts were made and
some kept and some rejected (both branches of the rejection rule ran). Power: with vLLM's own CPU
`expand_batch_to_tokens` (the defect `cpu_fixes` repairs) put back, the T = 1 test on 3,200 tokens gave p = 0.0
with the EAGLE-3 head (8 of 8,379 drafts kept) and p = 0.003 with the n-gram proposer (measured 2026-12-08; the
draft-model kind's power check is a test in test_vllm_engine)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("vllm")

from distribution_stats import ALPHA, conditional_chi2_pvalue, reference_probs
from tiny_models import VLLM_SHAPE, build_lm, make_prompts

from specroll.integrations.formats.eagle3 import save_eagle3_checkpoint
from specroll.integrations.vllm.engine import VllmEngine
from specroll.integrations.vllm.settings import VllmSettings
from specroll.rollout import EngineConfig, SamplingParams
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head
from specroll.rollout.drafters.version import DrafterVersion

SHAPE = VLLM_SHAPE


@pytest.mark.slow
def test_an_exported_eagle3_head_is_served_by_vllm_exactly(tmp_path):
    target = build_lm("llama", **SHAPE, layers=8, seed=21)
    target.save_pretrained(tmp_path / "target")
    head = Eagle3Head.for_target(target.config)
    save_eagle3_checkpoint(head, target, tmp_path / "eagle3", verifier=str(tmp_path / "target"))
    settings, base = VllmSettings(kv_cache_gib=1), EngineConfig(max_batch_size=16, max_seq_len=64)
    prompts = make_prompts(5, 2, 7, vocab=64, seed=5)
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    plain = VllmEngine(str(tmp_path / "target"), None, dataclasses.replace(base, gamma=0), settings)
    expected = [r.completion_ids for r in plain.generate(prompts, params, n=2)]
    spec = VllmEngine(str(tmp_path / "target"), str(tmp_path / "eagle3"),
                      dataclasses.replace(base, gamma=2, drafters=("eagle3",)), settings)
    assert [r.completion_ids for r in spec.generate(prompts, params, n=2)] == expected
    assert spec.stats.drafted > 0
    weights = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
               for k, v in spec_weights(tmp_path / "eagle3").items()}
    version = DrafterVersion(1, weights)
    spec.load_drafter(version)
    assert spec.served_drafter_digests() == [version.digest()]
    assert [r.completion_ids for r in spec.generate(prompts, params, n=2)] == expected


def spec_weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow
def test_the_suffix_kind_on_vllms_ngram_proposer_is_exact(tmp_path):
    target = build_lm("llama", **SHAPE, layers=2, seed=21)
    target.save_pretrained(tmp_path / "target")
    settings, base = VllmSettings(kv_cache_gib=1), EngineConfig(max_batch_size=16, max_seq_len=96)
    prompts = [(p * 4)[:24] for p in make_prompts(5, 3, 6, vocab=64, seed=7)]  # each repeats itself
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    plain = VllmEngine(str(tmp_path / "target"), None, dataclasses.replace(base, gamma=0), settings)
    expected = [r.completion_ids for r in plain.generate(prompts, params, n=2)]
    ngram = VllmEngine(str(tmp_path / "target"), None, dataclasses.replace(base, gamma=3, drafters=("suffix",)),
                       settings)
    assert [r.completion_ids for r in ngram.generate(prompts, params, n=2)] == expected
    assert ngram.stats.drafted > 0


DISTRIBUTION_PARAMS = [SamplingParams(max_new_tokens=8, temperature=1.0, seed=1),
                       SamplingParams(max_new_tokens=8, temperature=0.7, top_k=8, seed=2)]


def follows_the_target(engine: VllmEngine, target, prompts: list[list[int]]) -> None:
    """Every `DISTRIBUTION_PARAMS` sampling: χ² p-value above ALPHA, drafts made, some kept, some rejected."""
    for params in DISTRIBUTION_PARAMS:
        before = engine.stats.totals()
        rollouts = engine.generate(prompts, params)
        done = engine.stats.since(before)
        assert 0 < done.accepted < done.drafted, (params, done.accepted, done.drafted)
        probs, tokens = reference_probs(target, rollouts, params)
        assert conditional_chi2_pvalue(probs, tokens) > ALPHA, params


@pytest.mark.slow
def test_sampling_while_an_eagle3_head_drafts_follows_the_target(tmp_path):
    target = build_lm("llama", **SHAPE, layers=8, seed=21)
    target.save_pretrained(tmp_path / "target")
    head = Eagle3Head.for_target(target.config)
    save_eagle3_checkpoint(head, target, tmp_path / "eagle3", verifier=str(tmp_path / "target"))
    engine = VllmEngine(str(tmp_path / "target"), str(tmp_path / "eagle3"),
                        EngineConfig(gamma=3, drafters=("eagle3",), max_batch_size=64, max_seq_len=64),
                        VllmSettings(kv_cache_gib=1))
    follows_the_target(engine, target, make_prompts(1500, 3, 3, vocab=64, seed=9))


@pytest.mark.slow
def test_sampling_while_the_ngram_proposer_drafts_follows_the_target(tmp_path):
    target = build_lm("llama", **SHAPE, layers=2, seed=21)
    target.save_pretrained(tmp_path / "target")
    engine = VllmEngine(str(tmp_path / "target"), None,
                        EngineConfig(gamma=3, drafters=("suffix",), max_batch_size=64, max_seq_len=64),
                        VllmSettings(kv_cache_gib=1))
    prompts = [(p * 6)[:12] for p in make_prompts(1500, 2, 3, vocab=64, seed=9)]  # each repeats itself
    follows_the_target(engine, target, prompts)
