"""Lossless sampling: every emitted token follows the target's processed distribution.

The test generates long sampled completions (≥ 200k tokens in all) with a drafter deliberately
unlike the target, so drafts are rejected often and every path of the accept/reject rule runs:
accepted drafts, residual resamples at each draft position, bonus tokens, drafter-cache catch-up —
and with a draft vocabulary (q zero on 6 of the 16 ids, tokens the target emits).

Statistic: at generated position t the target's exact processed distribution p_t is known from one
full forward of the target over prompt + completion (processed by Hugging Face's own logits
warpers, independent of the engine). Under H0 ("x_t ~ p_t given the prefix") the count vector
S = Σ_t (onehot(x_t) − p_t) is a sum of martingale differences with predictable covariance
C = Σ_t (diag(p_t) − p_t p_tᵀ), so Sᵀ C⁺ S is χ² with rank(C) degrees of freedom (V − 1 here, or
fewer under top-k). Significance α = 1e-3 per test: a correct engine fails a given test with
probability 1e-3 (the seeds are fixed, so a run is deterministic). The same test applied to a
deliberately broken sampler (a rejected draft replaced by a sample of p instead of norm(max(p − q, 0)))
must reject H0 — which shows the test has the power to see a wrong sampler.

Both samplers run the same test. The invariant sampler always emits the target's Gumbel-max token, so
what its test checks is the noise: a position's Gumbel noise must be fresh given the prefix (keyed by
request and position, never reused) and of the right law. Its power check replaces the Gumbel noise
by the uniform it was made from (−log(−log u) left out), which must reject H0 as well.
"""

from __future__ import annotations

import functools

import pytest
import torch
from distribution_stats import ALPHA, conditional_chi2_pvalue, reference_probs
from tiny_models import build_lm, make_prompts

import specroll.rollout.sampling.noise as sampling_module
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.config import SuffixConfig
from specroll.rollout.drafters.draft_vocab import DraftVocab
from specroll.rollout.sampling.accept import RejectionSampling
from specroll.rollout.sampling.randomness import gumbel

VOCAB = 16
ROWS, NEW_TOKENS = 4000, 50  # 200k generated tokens per test of H0
# Two power checks run on a quarter of the rows (50k tokens; p-values ~1e-142 and 0 there): a wrong sampler
# rejected on fewer tokens is rejected on all of them. The point-mass one needs all 200k (p ~ 3e-8; 7e-4 on 100k).
POWER_ROWS = 1000
PROMPTS = make_prompts(ROWS, 2, 6, vocab=VOCAB, seed=3)


@functools.cache
def models(target_layers: int = 1):
    # SDPA: the target runs the engine's lean forward, the product's path (and twice as fast as eager here);
    # the eager forwards are covered by the greedy-exactness tests, the rule under test is the same.
    target = build_lm("llama", "sdpa", vocab=VOCAB, hidden=16, layers=target_layers, seed=11, logit_scale=10)
    drafter = build_lm("qwen2", "sdpa", vocab=VOCAB, hidden=16, layers=1, seed=12, logit_scale=10)
    return target, drafter


def sample_and_test(params: SamplingParams, sampler: str, gamma: int = 3,
                    wrong_sampler: RejectionSampling | None = None, drafters: tuple[str, ...] | None = None,
                    pin_choice: bool = False, rows: int = ROWS, draft_vocab: list[int] | None = None) -> float:
    target, drafter = models()
    # Half as many slots as rows: finished rows are refilled, so continuous batching is under test too.
    # The suffix drafter proposes every match it finds (min_survival 0): many drafts, most of them rejected.
    config = EngineConfig(max_batch_size=rows // 2, max_seq_len=6 + NEW_TOKENS, gamma=gamma, sampler=sampler,
                          drafters=drafters, suffix=SuffixConfig(min_survival=0.0))
    engine = SpecEngine(target, drafter if drafters is None or "model" in drafters else None, config)
    if wrong_sampler is not None:
        engine.accept_rule = wrong_sampler
    if draft_vocab is not None:
        engine.set_draft_vocab(DraftVocab(torch.as_tensor(draft_vocab), engine.vocab_size))
    if pin_choice:  # the per-row choice alternates: even slots take the model's drafts, odd ones the suffix's
        engine.drafter.choose = lambda found, gamma: [b % 2 == 0 for b in range(len(found.drafts))]
    rollouts = engine.generate(PROMPTS[:rows], params)
    assert 0.02 < engine.stats.acceptance_rate < 0.8  # rejections are frequent, acceptances too
    for share in engine.stats.by_drafter.values():  # every configured drafter served rows, > rows/4 each way
        assert share.accepted > rows // 4 and share.drafted - share.accepted > rows // 4
    probs, tokens = reference_probs(target, rollouts, params)
    assert tokens.numel() == rows * NEW_TOKENS
    # Tokens outside the processed support (top-k / top-p) are never emitted.
    assert bool((probs.gather(1, tokens[:, None]) > 0).all())
    return conditional_chi2_pvalue(probs, tokens)


SETTINGS = [  # each temperature once; top-k and top-p each folded into one of them
    SamplingParams(NEW_TOKENS, temperature=0.7, top_k=5, seed=1),
    SamplingParams(NEW_TOKENS, temperature=1.0, seed=2),
    SamplingParams(NEW_TOKENS, temperature=1.5, top_p=0.8, seed=3),
]


@pytest.mark.parametrize("sampler", ["rejection", "invariant"])
@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_emitted_tokens_follow_target_distribution(params, sampler):
    assert sample_and_test(params, sampler) > ALPHA


# The suffix drafter's q is a point mass (rejection: keep with probability p(d), else resample p without
# d), and the per-row choice mixes point masses with the model's q in one verification. These random
# models share little text (the suffix's drafts are rarely kept and the choice would take the model),
# so the choice is pinned to serve many rows with each.
# (The invariant sampler emits the target's own draw whatever q is: its test above covers it.)
@pytest.mark.parametrize("drafters", [("suffix",), ("suffix", "model")])
def test_suffix_and_combined_drafts_follow_target_distribution(drafters):
    assert sample_and_test(SETTINGS[1], "rejection", gamma=4, drafters=drafters, pin_choice=len(drafters) > 1) > ALPHA


# A draft vocabulary: the drafter's q is zero outside 10 of the 16 ids, which the target emits often (q is
# kept over the subset; q(d) and the residual's q row are read from that compact form).
SUBSET = list(range(3, 13))


@pytest.mark.parametrize("drafters", [("model",), ("suffix", "model")])
def test_drafts_over_a_draft_vocabulary_follow_target_distribution(drafters):
    assert sample_and_test(SETTINGS[1], "rejection", gamma=4, drafters=drafters, pin_choice=len(drafters) > 1,
                           draft_vocab=SUBSET) > ALPHA


def test_same_test_rejects_draft_vocabulary_drafts_without_residual():
    wrong = RejectionSampling(resample_residual=False)
    assert sample_and_test(SETTINGS[1], "rejection", wrong_sampler=wrong, rows=POWER_ROWS, draft_vocab=SUBSET) < ALPHA


def test_same_test_rejects_point_mass_drafts_without_residual():
    wrong = RejectionSampling(resample_residual=False)
    assert sample_and_test(SETTINGS[1], "rejection", gamma=4, wrong_sampler=wrong, drafters=("suffix",)) < ALPHA


def test_same_test_rejects_sampler_without_residual():
    assert sample_and_test(SETTINGS[1], "rejection", wrong_sampler=RejectionSampling(resample_residual=False),
                           rows=POWER_ROWS) < ALPHA


def test_same_test_rejects_invariant_sampler_with_uniform_noise(monkeypatch):
    monkeypatch.setattr(sampling_module, "gumbel", lambda *args: torch.exp(-torch.exp(-gumbel(*args))))
    assert sample_and_test(SETTINGS[1], "invariant", rows=POWER_ROWS) < ALPHA
