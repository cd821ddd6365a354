"""Lossless sampling with the EAGLE-3 drafter: emitted tokens follow the target's p, fresh and trained.

The statistic of `test_engine_distribution` (a conditional χ² on Σ_t (onehot(x_t) − p_t), exact p_t from a
full target forward, α = 1e-3 per test: a correct engine fails a given test with probability 1e-3; seeds fixed)
on 1500 rows × 40 tokens = 60k tokens per test. The heads: a fresh (random) EAGLE-3 head through the target's
LM head; the same with its own LM head over 10 of the 16 ids (q = 0 on ids the target emits: `d2t`); and a head
trained online (the one learner, 40 steps on the fresh head's rollouts). Each case checks that rejections are
frequent (else the test could not fail). Default suite: T = 1 (own head, rejection; fresh, invariant),
T = 0.7 with top-k 5 (fresh), T = 1.3 with top-p 0.8 (trained); the slow marker runs every head under every
setting and both samplers.
"""

from __future__ import annotations

import functools

import pytest
import torch
from distribution_stats import ALPHA, conditional_chi2_pvalue, reference_probs
from tiny_models import build_lm, make_prompts

from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.heads.learner import HeadLearner
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head

ROWS, NEW_TOKENS = 1500, 40
VOCAB = 16
PROMPTS = make_prompts(ROWS, 2, 6, vocab=VOCAB, seed=4)
SETTINGS = {"T1": SamplingParams(NEW_TOKENS, temperature=1.0, seed=5),
            "T0.7-topk5": SamplingParams(NEW_TOKENS, temperature=0.7, top_k=5, seed=6),
            "T1.3-topp0.8": SamplingParams(NEW_TOKENS, temperature=1.3, top_p=0.8, seed=7)}
OWN_IDS = torch.arange(3, 13)  # 10 of 16 ids: the target emits the others too


@functools.cache
def target():
    return build_lm("llama", "sdpa", vocab=VOCAB, hidden=16, layers=4, seed=11, logit_scale=10)


def fresh_head() -> Eagle3Head:
    return Eagle3Head.for_target(target().config, seed=2)


def own_head() -> Eagle3Head:
    head = Eagle3Head.for_target(target().config, seed=2, draft_ids=OWN_IDS)
    with torch.no_grad():
        head.lm_head.weight.copy_(target().lm_head.weight[OWN_IDS])
    return head


@functools.cache
def trained_state() -> dict[str, torch.Tensor]:
    config = EngineConfig(max_batch_size=64, max_seq_len=6 + NEW_TOKENS, gamma=3, record_signals=True)
    rollouts = SpecEngine(target(), fresh_head(), config).generate(
        make_prompts(128, 2, 6, vocab=VOCAB, seed=8), SamplingParams(NEW_TOKENS, temperature=1.0, seed=9))
    learner = HeadLearner(fresh_head(), target().get_input_embeddings(), target().get_output_embeddings(),
                          LearnerConfig(lr=3e-3, max_steps=40, batch_size=16, warmup_steps=0, gate_z=0.0))
    learner.add_rollouts(rollouts)
    assert learner.train_round().published  # it learnt something: the gate took it
    return learner.published_version().weights


def trained_head() -> Eagle3Head:
    head = fresh_head()
    head.load_state_dict(trained_state())
    return head


HEADS = {"fresh": fresh_head, "own_head": own_head, "trained": trained_head}


def check_lossless(head_name: str, setting: str, sampler: str) -> None:
    params = SETTINGS[setting]
    config = EngineConfig(max_batch_size=ROWS // 2, max_seq_len=6 + NEW_TOKENS, gamma=3, sampler=sampler)
    engine = SpecEngine(target(), HEADS[head_name](), config)
    rollouts = engine.generate(PROMPTS, params)
    stats = engine.stats
    assert 0.02 < stats.acceptance_rate < 0.95
    assert stats.accepted > 500 and stats.drafted - stats.accepted > 500  # often kept, often rejected
    probs, tokens = reference_probs(target(), rollouts, params)
    assert tokens.numel() == ROWS * NEW_TOKENS
    assert bool((probs.gather(1, tokens[:, None]) > 0).all())
    if head_name == "own_head":  # the target emitted tokens the head can never propose
        assert bool((~torch.isin(tokens, OWN_IDS)).sum() > 1000)
    assert conditional_chi2_pvalue(probs, tokens) > ALPHA


@pytest.mark.parametrize(("head_name", "setting", "sampler"), [
    ("own_head", "T1", "rejection"), ("fresh", "T1", "invariant"), ("fresh", "T0.7-topk5", "rejection"),
    ("trained", "T1.3-topp0.8", "rejection"),
])
def test_emitted_tokens_follow_target_distribution(head_name, setting, sampler):
    check_lossless(head_name, setting, sampler)


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["rejection", "invariant"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("head_name", sorted(HEADS))
def test_every_head_setting_and_sampler(head_name, setting, sampler):
    check_lossless(head_name, setting, sampler)
