"""Lossless sampling with the recurrent (ReDrafter) drafter, chains and beam-search trees.

The statistic of `test_engine_distribution` (a conditional χ² on Σ_t (onehot(x_t) − p_t), exact p_t from a full
target forward, α = 1e-3 per test: a correct engine fails a given test with probability 1e-3; seeds fixed) on
1500 rows × 40 tokens = 60k tokens per test. Power: the same statistic rejects the tree rule that tests every sibling
against p itself on 50k tokens (`test_tree_distribution.test_same_test_rejects_siblings_tested_against_p_itself`,
p ~ 1e-142), and each case here checks that drafts are often kept and often rejected (else it could not fail).
The heads: a random one (every weight drawn: drafts unlike the target's) through the target's LM head, and one with
its own LM head over 10 of the 16 ids (q = 0 on ids the target emits). Default suite: T = 1 and T = 0.7 with top-k
5, chains and beams of width 3, both samplers, one case each; the slow marker runs every head, shape, setting and
sampler. And with the invariant sampler the output is plain decoding's, token for token, chains and beams.
"""

from __future__ import annotations

import functools

import pytest
import torch
from distribution_stats import ALPHA, conditional_chi2_pvalue, reference_probs
from tiny_models import build_lm, make_prompts, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads import RecurrentHead

ROWS, NEW_TOKENS = 1500, 40
VOCAB = 16
PROMPTS = make_prompts(ROWS, 2, 6, vocab=VOCAB, seed=4)
SETTINGS = {"T1": SamplingParams(NEW_TOKENS, temperature=1.0, seed=5),
            "T0.7-topk5": SamplingParams(NEW_TOKENS, temperature=0.7, top_k=5, seed=6)}
SHAPES = {"chain": 1, "beams": 3}  # tree width: a chain, or the beam search's 3 beams per level
OWN_IDS = torch.arange(3, 13)  # 10 of 16 ids: the target emits the others too


@functools.cache
def target():
    return build_lm("llama", "sdpa", vocab=VOCAB, hidden=16, layers=2, seed=11, logit_scale=10)


def random_head(model=None, draft_ids: torch.Tensor | None = None) -> RecurrentHead:
    """A head with every weight drawn (a fresh one reads the target's own p out at first)."""
    head = RecurrentHead.for_target((model or target()).config, draft_ids=draft_ids)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in head.parameters():
            param.copy_(0.5 * torch.randn(param.shape, generator=gen))
    return head


def own_head() -> RecurrentHead:
    head = random_head(draft_ids=OWN_IDS)
    with torch.no_grad():
        head.lm_head.weight.copy_(target().lm_head.weight[OWN_IDS])
    return head


HEADS = {"random": random_head, "own_head": own_head}


def check_lossless(head_name: str, shape: str, setting: str, sampler: str) -> None:
    params, width = SETTINGS[setting], SHAPES[shape]
    config = EngineConfig(max_batch_size=ROWS // 2, max_seq_len=6 + NEW_TOKENS, gamma=3, tree_width=width,
                          sampler=sampler, drafters=("recurrent",))
    engine = SpecEngine(target(), HEADS[head_name](), config)
    rollouts = engine.generate(PROMPTS, params)
    stats = engine.stats
    assert stats.tree_steps == (stats.steps if width > 1 else 0)
    assert 0.02 < stats.acceptance_rate < 0.95
    assert stats.accepted > 500 and stats.drafted - stats.accepted > 500  # often kept, often rejected
    probs, tokens = reference_probs(target(), rollouts, params)
    assert tokens.numel() == ROWS * NEW_TOKENS
    assert bool((probs.gather(1, tokens[:, None]) > 0).all())
    if head_name == "own_head":  # the target emitted tokens the head can never propose
        assert bool((~torch.isin(tokens, OWN_IDS)).sum() > 1000)
    assert conditional_chi2_pvalue(probs, tokens) > ALPHA


@pytest.mark.parametrize(("head_name", "shape", "setting", "sampler"), [
    ("random", "chain", "T1", "rejection"), ("random", "beams", "T0.7-topk5", "rejection"),
    ("own_head", "beams", "T1", "invariant"), ("random", "chain", "T0.7-topk5", "invariant"),
])
def test_emitted_tokens_follow_target_distribution(head_name, shape, setting, sampler):
    check_lossless(head_name, shape, setting, sampler)


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["rejection", "invariant"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("head_name", sorted(HEADS))
def test_every_head_shape_setting_and_sampler(head_name, shape, setting, sampler):
    check_lossless(head_name, shape, setting, sampler)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("params", [SamplingParams(24, temperature=1.0, stop_token_ids=(3,), seed=11),
                                    SamplingParams(24, temperature=0.7, top_k=8, stop_token_ids=(3,), seed=12)],
                         ids=["T1", "T0.7-k8"])
def test_invariant_output_is_plain_decodings(shape, params):
    """12 prompts × 2 samples through 5 slots (rows refilled mid-call): the tokens of a plain engine on the seed."""
    model = tiny_lm("llama", logit_scale=15.0)
    prompts = make_prompts(12, 2, 9, seed=4)
    plain = SpecEngine(model, None, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=0, sampler="invariant"))
    config = EngineConfig(max_batch_size=5, max_seq_len=40, gamma=3, tree_width=SHAPES[shape], sampler="invariant",
                          drafters=("recurrent",))
    engine = SpecEngine(model, random_head(model), config)
    expected = [r.completion_ids for r in plain.generate(prompts, params, n=2)]
    assert [r.completion_ids for r in engine.generate(prompts, params, n=2)] == expected
    assert engine.stats.accepted > 0 and engine.stats.drafted > engine.stats.accepted
