"""Online draft vocabularies: the learner recounts the subset from the policy's rollouts as the policy drifts.

Through the public path (`LocalBackend` with `EngineConfig.draft_vocab` and a learner): the learner starts from
the engine's first subset, counts the completion tokens of every rollout (older policy versions decayed), trains
and scores its candidate over the most counted ids, and a published version carries its subset to the engine,
whose drafts then stay inside it. After a policy update that moves which tokens the policy emits, the published
subset covers the new policy's tokens better than the first one. The frozen-subset setting keeps the first.
Checkpoints keep subsets and counts. The learner's q over a subset is the drafter's softmax renormalised there
(`divergence.restrict`), with the target's mass on ids outside it in no bucket.
"""

from __future__ import annotations

import pytest
import torch
from online_fixtures import markov_chain, tiny_llama, train_lm

from specroll.integrations.local_backend import LocalBackend
from specroll.online_drafter import LearnerConfig, expected_acceptance
from specroll.online_drafter.divergence import bucketed_kl, restrict
from specroll.rollout import EngineConfig, SamplingParams
from specroll.rollout.drafters.draft_vocab import initial_ids

V, SIZE = 32, 12
PROMPTS = [[i % V, (5 * i) % V] for i in range(24)]
PARAMS = SamplingParams(max_new_tokens=16, temperature=1.0, seed=0)


def chain_on(tokens: list[int], seed: int) -> torch.Tensor:
    """A Markov chain whose successors all lie in `tokens`: a policy that emits those tokens."""
    base = markov_chain(seed, vocab=len(tokens))
    chain = torch.full((V, V), 0.0)
    ids = torch.tensor(tokens)
    chain[:, ids] = base[torch.arange(V) % len(tokens)]
    return chain


@pytest.fixture(scope="module")
def policies():
    """A policy trained to emit ids 0..15, and its update, which emits ids 16..31."""
    g = torch.Generator().manual_seed(0)
    first = tiny_llama(32, 2, seed=0)
    train_lm(first, chain_on(list(range(16)), seed=1), steps=120, lr=1e-2, g=g)
    moved = tiny_llama(32, 2, seed=0)
    moved.load_state_dict(first.state_dict())
    train_lm(moved, chain_on(list(range(16, 32)), seed=2), steps=120, lr=1e-2, g=g)
    return first, moved


def backend(first, updates: bool = True) -> LocalBackend:
    target = tiny_llama(32, 2, seed=0)
    target.load_state_dict(first.state_dict())
    engine = EngineConfig(max_batch_size=24, max_seq_len=24, gamma=3, signal_top_k=8, draft_vocab=SIZE)
    learner = LearnerConfig(lr=1e-2, max_steps=20, batch_size=8, seed=0, draft_vocab_updates=updates)
    return LocalBackend.from_models(target, tiny_llama(16, 1, seed=1), engine, learner)


def covered(rollouts, ids: torch.Tensor) -> float:
    tokens = torch.tensor([t for r in rollouts for t in r.completion_ids])
    return float(torch.isin(tokens, ids).float().mean())


def run(first, moved, updates: bool):
    b = backend(first, updates)
    b.generate(PROMPTS, PARAMS)
    b.start_learner_round(None)
    b.finish_learner_round()
    b.sync_policy(moved.state_dict(), version=1)
    for _ in range(2):
        latest = b.generate(PROMPTS, PARAMS)
        b.start_learner_round(None)
        b.finish_learner_round()
    return b, latest


def test_the_published_subset_follows_the_policys_tokens(policies):
    first, moved = policies
    b, latest = run(first, moved, updates=True)
    learner, engine = b.learner, b.engine
    start = initial_ids(SIZE, V, first.config)
    assert torch.equal(learner.draft_vocab("frozen"), start)
    assert learner.version >= 1
    published = learner.draft_vocab("published")
    assert torch.equal(learner.published_version().draft_vocab, published)
    assert torch.equal(engine.draft_vocab(), published)  # the engine drafts over the served subset
    # The moved policy emits ids 16..31: the recounted subset holds them (measured: 89% of its tokens), the
    # first one (ids 0..11, EOS among them) almost none (0.3%).
    assert covered(latest, published) > 0.5 > covered(latest, start) + 0.3
    # Drafts stay inside the served subset.
    drafts = []
    propose = engine.drafter.propose

    def logged(*args, **kwargs):
        proposal = propose(*args, **kwargs)
        drafts.append(proposal.drafts.flatten())
        return proposal

    engine.drafter.propose = logged
    b.generate(PROMPTS[:6], PARAMS)
    assert bool(torch.isin(torch.cat(drafts), published).all())


def test_the_frozen_subset_setting_keeps_the_first_subset(policies):
    first, moved = policies
    b, _ = run(first, moved, updates=False)
    start = initial_ids(SIZE, V, first.config)
    for name in ("frozen", "published", "candidate"):
        assert torch.equal(b.learner.draft_vocab(name), start)
    assert torch.equal(b.engine.draft_vocab(), start)


def test_counts_decay_with_the_policy_version(policies):
    first, moved = policies
    b = backend(first)
    counts = b.learner.token_counts
    old = b.generate(PROMPTS, PARAMS)
    b.sync_policy(moved.state_dict(), version=1)
    new = b.generate(PROMPTS, PARAMS)
    expected = torch.zeros(V, dtype=torch.float64)
    for rollouts, weight in ((old, b.learner.config.draft_vocab_decay), (new, 1.0)):
        for r in rollouts:
            expected += torch.bincount(torch.tensor(r.completion_ids), minlength=V).double() * weight
    torch.testing.assert_close(counts.counts, expected)


def test_a_checkpoint_keeps_subsets_and_counts(policies, tmp_path):
    first, moved = policies
    b, _ = run(first, moved, updates=True)
    learner = b.learner
    learner.save(tmp_path / "learner.pt")
    resumed = type(learner).load(tmp_path / "learner.pt", tiny_llama(16, 1, seed=7))
    for name in ("frozen", "published", "candidate"):
        assert torch.equal(resumed.draft_vocab(name), learner.draft_vocab(name))
    torch.testing.assert_close(resumed.token_counts.counts, learner.token_counts.counts)
    assert torch.equal(resumed.published_version().draft_vocab, learner.published_version().draft_vocab)


def test_q_over_a_subset_is_renormalised_there_and_ids_outside_score_nothing():
    log_q = torch.tensor([[[0.4, 0.3, 0.2, 0.1]]]).log()  # [1, 1, V = 4]
    allowed = torch.tensor([True, False, True, False])
    q = restrict(log_q, allowed).exp()
    torch.testing.assert_close(q, torch.tensor([[[0.4 / 0.6, 0.0, 0.2 / 0.6, 0.0]]]))
    topk_ids, topk_p = torch.tensor([[[1, 0]]]), torch.tensor([[[0.5, 0.3]]])  # the target's top id is outside
    acc = expected_acceptance(restrict(log_q, allowed), topk_ids, topk_p)
    torch.testing.assert_close(acc, torch.tensor([[0.3]]))  # min(0.3, 2/3) at id 0; id 1 unreachable
    kl = bucketed_kl(restrict(log_q, allowed), topk_ids, topk_p)
    assert bool(kl.isfinite().all())
