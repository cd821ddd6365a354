"""Lossless sampling with token trees: every emitted token follows the target's processed distribution.

The statistic, models, prompts and significance are the chain test's (`test_engine_distribution`: the
conditional χ² of the emitted tokens against the exact processed p_t at every position, α = 1e-3 per test,
200k generated tokens per test of H0, seeds fixed). Here every speculative step verifies a tree — γ = 3 levels
of 3 nodes, the root's children a draw without replacement, recursive rejection sampling over the siblings
(`sampling.tree_accept.TreeRejection`) — with a drafter unlike the target, so siblings are tried and rejected
at every depth. Power: the same test rejects the deliberately wrong tree rule that tests every sibling against
p itself instead of the residual left by the siblings before it (checked on a quarter of the tokens, 50k).
"""

from __future__ import annotations

import pytest
import torch
from distribution_stats import ALPHA, conditional_chi2_pvalue, reference_probs
from test_engine_distribution import NEW_TOKENS, POWER_ROWS, PROMPTS, ROWS, SETTINGS, SUBSET, models
from test_tree_engine import head_drafter

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.config import SuffixConfig
from specroll.rollout.drafters.draft_vocab import DraftVocab
from specroll.rollout.sampling.tree_accept import TreeRejection

WIDTH, DEPTH = 3, 3


def sample_and_test(params: SamplingParams, sampler: str, drafters: tuple[str, ...] | None = None,
                    wrong_rule: TreeRejection | None = None, rows: int = ROWS,
                    draft_vocab: list[int] | None = None, head: str | None = None) -> float:
    # A block drafter fuses features from layers below the last: its target has two layers (the reference
    # probabilities are that target's, so the test is the same test).
    target, drafter = models(target_layers=2 if head == "block" else 1)
    if head is not None:  # a head on the target's hidden states instead of the drafter LM
        drafter, drafters = head_drafter(head, target), (head,)
    config = EngineConfig(max_batch_size=rows // 2, max_seq_len=6 + NEW_TOKENS, gamma=DEPTH, tree_width=WIDTH,
                          sampler=sampler, drafters=drafters, suffix=SuffixConfig(min_survival=0.0))
    engine = SpecEngine(target, drafter, config)
    if wrong_rule is not None:
        engine.tree_step.rule = wrong_rule
    if draft_vocab is not None:
        engine.set_draft_vocab(DraftVocab(torch.as_tensor(draft_vocab), engine.vocab_size))
    rollouts = engine.generate(PROMPTS[:rows], params)
    stats = engine.stats
    assert stats.tree_steps == stats.steps and stats.tree_nodes_per_row == WIDTH * DEPTH
    assert 0.02 < stats.acceptance_rate < 0.9  # kept and rejected depths both frequent
    probs, tokens = reference_probs(target, rollouts, params)
    assert tokens.numel() == rows * NEW_TOKENS
    assert bool((probs.gather(1, tokens[:, None]) > 0).all())  # nothing outside the processed support
    return conditional_chi2_pvalue(probs, tokens)


def test_tree_rejection_follows_target_distribution():
    assert sample_and_test(SETTINGS[1], "rejection") > ALPHA


def test_tree_of_suffix_and_model_drafts_follows_target_distribution():
    # The suffix continuation's point masses tried first at every level, then the model's draws.
    assert sample_and_test(SETTINGS[1], "rejection", drafters=("suffix", "model")) > ALPHA


def test_tree_over_a_draft_vocabulary_follows_target_distribution():
    assert sample_and_test(SETTINGS[0], "rejection", draft_vocab=SUBSET) > ALPHA


@pytest.mark.parametrize("head", ["eagle", "medusa", "block"])
def test_head_trees_follow_target_distribution(head):
    """EAGLE-2's tree over an EAGLE head's own cache, Medusa's tree and a block's marginals as a tree (`propose_tree`
    of each drafter)."""
    assert sample_and_test(SETTINGS[1], "rejection", head=head) > ALPHA


def test_invariant_tree_noise_follows_target_distribution():
    assert sample_and_test(SETTINGS[2], "invariant") > ALPHA


def test_same_test_rejects_siblings_tested_against_p_itself():
    wrong = TreeRejection(update_residual=False)
    assert sample_and_test(SETTINGS[1], "rejection", wrong_rule=wrong, rows=POWER_ROWS) < ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["rejection", "invariant"])
@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_every_setting_with_trees_follows_target_distribution(params, sampler):
    assert sample_and_test(params, sampler) > ALPHA
