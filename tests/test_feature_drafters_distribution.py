"""Lossless sampling with the drafters that read the policy: emitted tokens follow the target's p.

The statistic of `test_engine_distribution` (a conditional χ² on Σ_t (onehot(x_t) − p_t), exact p_t from
a full target forward, α = 1e-3 per test: a correct engine fails a given test with probability 1e-3;
seeds fixed) on 1500 rows × 40 tokens = 60k tokens per test, with drafters far from the target so
rejections are frequent: layer-skip at 1 of 2 layers, a fresh (random) EAGLE head, fresh Medusa heads
(which propose the target's distribution one position back), and the EAGLE head with the suffix drafter
under a pinned per-row choice (even slots the head, odd ones the suffix), and the EAGLE head over a draft
vocabulary (10 of the 16 ids). Both samplers on one drafter.
"""

from __future__ import annotations

import functools

import pytest
import torch
from distribution_stats import ALPHA, conditional_chi2_pvalue, reference_probs
from tiny_models import build_lm, make_prompts

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.config import SuffixConfig
from specroll.rollout.drafters.draft_vocab import DraftVocab

ROWS, NEW_TOKENS = 1500, 40
VOCAB = 16
PROMPTS = make_prompts(ROWS, 2, 6, vocab=VOCAB, seed=4)
PARAMS = SamplingParams(NEW_TOKENS, temperature=1.0, seed=5)


@functools.cache
def target():
    return build_lm("llama", "sdpa", vocab=VOCAB, hidden=16, layers=2, seed=11, logit_scale=10)


@pytest.mark.parametrize(("drafters", "sampler", "params"), [
    (("layer_skip",), "rejection", PARAMS),
    (("eagle",), "rejection", SamplingParams(NEW_TOKENS, temperature=0.7, top_k=5, seed=6)),
    (("medusa",), "rejection", SamplingParams(NEW_TOKENS, temperature=1.5, top_p=0.8, seed=7)),
    (("eagle", "suffix"), "rejection", PARAMS),
    (("medusa",), "invariant", PARAMS),
    (("eagle", "draft_vocab"), "rejection", PARAMS),  # q over ids 3..12 of 16, zero on ids the target emits
], ids=lambda v: "+".join(v) if isinstance(v, tuple) else v if isinstance(v, str) else f"T{v.temperature}")
def test_emitted_tokens_follow_target_distribution(drafters, sampler, params):
    subset = "draft_vocab" in drafters
    drafters = tuple(k for k in drafters if k != "draft_vocab")
    config = EngineConfig(max_batch_size=ROWS // 2, max_seq_len=6 + NEW_TOKENS, gamma=3, sampler=sampler,
                          drafters=drafters, layer_skip_layers=1, suffix=SuffixConfig(min_survival=0.0))
    engine = SpecEngine(target(), None, config)
    if subset:
        engine.set_draft_vocab(DraftVocab(torch.as_tensor(list(range(3, 13))), engine.vocab_size))
    if len(drafters) > 1:
        engine.drafter.choose = lambda found, gamma: [b % 2 == 0 for b in range(len(found.drafts))]
    rollouts = engine.generate(PROMPTS, params)
    assert 0.02 < engine.stats.acceptance_rate < 0.95
    for share in engine.stats.by_drafter.values():  # every configured drafter served rows, often rejected
        assert share.accepted > 500 and share.drafted - share.accepted > 500
    probs, tokens = reference_probs(target(), rollouts, params)
    assert tokens.numel() == ROWS * NEW_TOKENS
    assert bool((probs.gather(1, tokens[:, None]) > 0).all())
    assert conditional_chi2_pvalue(probs, tokens) > ALPHA
