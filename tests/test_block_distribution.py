"""Lossless sampling with the block drafter: emitted tokens follow the target's p, fresh and trained.

The block's drafts are drawn per position from its marginals q_i (T, top-k, top-p applied as for the target),
and verified with exactly those q_i: the rejection rule is exact for such proposals, the invariant rule for any.
The statistic of `test_engine_distribution` (a conditional χ² on Σ_t (onehot(x_t) − p_t), exact p_t from a full
target forward, α = 1e-3 per test: a correct engine fails a given test with probability 1e-3; seeds fixed) on
1500 rows × 40 tokens = 60k tokens per test. The heads: a fresh (random) block head of k = 4 (3 drafts a step),
and one trained online (the one learner, 40 steps on the fresh head's rollouts). Each case checks that rejections
are frequent (else the test could not fail). Default suite: T = 1 (fresh, both samplers), T = 0.7 with top-k 5
(fresh), T = 1.3 with top-p 0.8 (trained); the slow marker runs both heads under every setting and both samplers.
"""

from __future__ import annotations

import functools

import pytest
import torch
from distribution_stats import ALPHA, conditional_chi2_pvalue, reference_probs
from tiny_models import build_lm, make_prompts

from specroll.online_drafter import LearnerConfig, make_online_learner
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads.block import BlockHead

ROWS, NEW_TOKENS = 1500, 40
VOCAB = 16
PROMPTS = make_prompts(ROWS, 2, 6, vocab=VOCAB, seed=4)
SETTINGS = {"T1": SamplingParams(NEW_TOKENS, temperature=1.0, seed=5),
            "T0.7-topk5": SamplingParams(NEW_TOKENS, temperature=0.7, top_k=5, seed=6),
            "T1.3-topp0.8": SamplingParams(NEW_TOKENS, temperature=1.3, top_p=0.8, seed=7)}


@functools.cache
def target():
    return build_lm("llama", "sdpa", vocab=VOCAB, hidden=16, layers=4, seed=11, logit_scale=10)


def fresh_head() -> BlockHead:
    return BlockHead.for_target(target().config, block_size=4, seed=2)


@functools.cache
def trained_state() -> dict[str, torch.Tensor]:
    config = EngineConfig(max_batch_size=64, max_seq_len=6 + NEW_TOKENS, gamma=3, record_signals=True)
    rollouts = SpecEngine(target(), fresh_head(), config).generate(
        make_prompts(128, 2, 6, vocab=VOCAB, seed=8), SamplingParams(NEW_TOKENS, temperature=1.0, seed=9))
    learner = make_online_learner(fresh_head(), target(), LearnerConfig(lr=3e-3, max_steps=40, batch_size=16,
                                                                          warmup_steps=0, gate_z=0.0))
    learner.add_rollouts(rollouts)
    assert learner.train_round().published  # it learnt something: the gate took it
    return learner.published_version().weights


def trained_head() -> BlockHead:
    head = fresh_head()
    head.load_state_dict(trained_state())
    return head


HEADS = {"fresh": fresh_head, "trained": trained_head}


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
    assert conditional_chi2_pvalue(probs, tokens) > ALPHA


@pytest.mark.parametrize(("head_name", "setting", "sampler"), [
    ("fresh", "T1", "rejection"), ("fresh", "T1", "invariant"), ("fresh", "T0.7-topk5", "rejection"),
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


def test_each_draft_is_drawn_from_the_processed_q_it_is_verified_with():
    """Under T = 0.7 and top-k 3 each draft's q has at most 3 ids and is the block's logits processed so; the draw
    the engine hands the drafter sees exactly that q (the one the proposal carries) at each draft index."""
    engine = SpecEngine(target(), fresh_head(), EngineConfig(max_batch_size=4, max_seq_len=30, gamma=3))
    params = SamplingParams(10, temperature=0.7, top_k=3, seed=0)
    steps = engine.generate_steps(PROMPTS[:4], params)
    next(steps)
    seen = []

    def draw(q, i):
        seen.append((i, q.clone()))
        return q.argmax(-1)

    proposal = engine.drafter.propose(slice(0, 4), engine.rows, 3, params, draw)
    steps.close()
    assert [i for i, _ in seen] == [0, 1, 2]
    for i, q in seen:
        torch.testing.assert_close(q, proposal.q.probs[:, i])
        assert bool(((q > 0).sum(-1) <= 3).all()) and torch.allclose(q.sum(-1), torch.ones(4))
