"""Signals recorded by the engine are what the learner assumes they are.

The learner distils q toward the recorded top-k p at each completion position, teacher-forced on
prompt + completion, so the recording must equal the target's processed distribution given exactly
that context; and the drafter must propose from the true context (a stale drafter cache after a
rejection once halved acceptance without changing any sample).
"""

from __future__ import annotations

import copy

import pytest
import torch
from online_fixtures import markov_chain, sample_sequences, tiny_llama, train_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.sampling.logits import process_logits

K = 8


@pytest.fixture(scope="module")
def trained_pair():
    g = torch.Generator().manual_seed(0)
    chain = markov_chain(1)
    target, drafter = tiny_llama(32, 2, seed=0), tiny_llama(16, 1, seed=1)
    train_lm(target, chain, 40, 3e-3, g)
    train_lm(drafter, chain, 40, 3e-3, g)
    return target, drafter, sample_sequences(chain, 8, 3, g).tolist()


def make_engine(target, drafter, gamma=3):
    config = EngineConfig(max_batch_size=4, max_seq_len=40, gamma=gamma, record_signals=True, signal_top_k=K)
    return SpecEngine(copy.deepcopy(target), copy.deepcopy(drafter), config)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_signals_equal_target_distribution_on_prompt_plus_completion(trained_pair, temperature):
    target, drafter, prompts = trained_pair
    params = SamplingParams(max_new_tokens=12, temperature=temperature, seed=0)
    for rollout in make_engine(target, drafter).generate(prompts, params):
        ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids])
        with torch.no_grad():
            logits = target(input_ids=ids).logits[0, len(rollout.prompt_ids) - 1 : -1]  # [T, V]
        # Greedy signals are the T = 1 distribution (the processed one is one-hot).
        p = logits.softmax(-1) if temperature == 0 else process_logits(logits, params)
        top = p.topk(K, dim=-1)
        sig = rollout.signals
        assert torch.allclose(sig.topk_probs, top.values, atol=1e-5)
        assert torch.allclose(p.gather(-1, sig.topk_ids), top.values, atol=1e-5)


def test_signals_mark_drafts_and_rejections(trained_pair):
    target, drafter, prompts = trained_pair
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=0)
    rollouts = make_engine(target, drafter).generate(prompts, params)
    for rollout in rollouts:
        sig = rollout.signals
        completion = torch.tensor(rollout.completion_ids)
        assert not (sig.accepted & (sig.draft_ids < 0)).any()  # accepted implies drafted
        assert torch.equal(completion[sig.accepted], sig.draft_ids[sig.accepted])  # kept drafts are the tokens
    assert sum(int((r.signals.draft_ids >= 0).sum()) for r in rollouts) > 0
    # The engine also counts drafts accepted past the token budget (then cut), so <= not ==.
    assert all(int(r.signals.accepted.sum()) <= r.num_accepted for r in rollouts)


def test_drafter_proposes_from_the_true_context_after_rejections(trained_pair):
    """Every q the drafter proposes equals a full-context forward of the drafter (γ = 3, T = 1)."""
    target, drafter, prompts = trained_pair
    engine = make_engine(target, drafter)
    propose, errors = engine.drafter.propose, []

    def checked_propose(live, rows, gamma, params, generator):
        proposal = propose(live, rows, gamma, params, generator)
        for b in range(live.stop):
            context = torch.cat([rows.tokens[b, : int(rows.seq_len[b])], proposal.drafts[b]])
            with torch.no_grad():
                q_ref = (drafter(input_ids=context[None]).logits[0] / params.temperature).softmax(-1)
            start = int(rows.seq_len[b]) - 1
            errors.append(float((q_ref[start : start + gamma] - proposal.q.probs[b]).abs().max()))
        return proposal

    engine.drafter.propose = checked_propose
    engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=1.0, seed=0))
    assert engine.stats.accepted < engine.stats.drafted  # rejections happened
    assert max(errors) < 1e-4
