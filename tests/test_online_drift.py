"""Under a controlled policy drift the online drafter keeps its acceptance; a frozen one loses it.

Setup (CPU, fixed seeds): a tiny Llama target pretrained on a Markov chain, a smaller drafter
distilled from it. The policy then drifts toward a reweighted, sharper chain (`shifted_chain`, like
an RL update) a couple of AdamW steps per version; each version: rollouts (T = 1, γ = 3, signals on)
→ `add_rollouts` → `train_round` → publish to the engine if better → next policy update.

The online acceptance of version v is the published drafter's expected acceptance on version v's
held-out rollouts *before* it trains on them (`acceptance_before`): the drafter that actually served
those rollouts, trained only on older versions — the one-version lag of the real pipeline, where
the learner trains while the trainer updates the policy.
"""

from __future__ import annotations

import copy

import pytest
import torch
from online_fixtures import distill_lm, markov_chain, sample_sequences, shifted_chain, tiny_llama, train_lm

from specroll.online_drafter import BufferConfig, DraftBuffer, DraftLearner, LearnerConfig
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

NUM_VERSIONS = 9  # policy versions 0..8
POLICY_LR = 7e-4


@pytest.fixture(scope="module")
def drift_run():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster, and the CI machine is shared
    try:
        yield _run_drift()
    finally:
        torch.set_num_threads(threads)


def _run_drift():
    g = torch.Generator().manual_seed(0)
    chain = markov_chain(1)
    drifted = shifted_chain(chain, seed=2, sharpness=3.0)
    target, drafter = tiny_llama(32, 2, seed=0), tiny_llama(32, 1, seed=1)
    train_lm(target, chain, 100, 3e-3, g)
    distill_lm(drafter, target, chain, 150, 3e-3, g)
    policy = copy.deepcopy(target)  # the trainer's copy; the engine gets its weights by update_target
    policy_optimizer = torch.optim.AdamW(policy.parameters(), lr=POLICY_LR)
    engine = SpecEngine(target, drafter, EngineConfig(max_batch_size=64, max_seq_len=40, gamma=3,
                                                      record_signals=True, signal_top_k=16))
    learner = DraftLearner(drafter, LearnerConfig(lr=3e-3, max_steps=60, batch_size=16, seed=0),
                           DraftBuffer(BufferConfig(recency_decay=0.3)))
    prompts = sample_sequences(chain, 64, 2, g).tolist()
    reports = []
    for version in range(NUM_VERSIONS):
        if version:
            policy.train()
            for _ in range(1):
                ids = sample_sequences(drifted, 32, 32, g)
                loss = policy(input_ids=ids, labels=ids).loss
                policy_optimizer.zero_grad()
                loss.backward()
                policy_optimizer.step()
            policy.eval()
            engine.update_target({n: p.detach() for n, p in policy.named_parameters()}, version)
        rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=32, temperature=1.0, seed=version))
        learner.add_rollouts(rollouts)
        report = learner.train_round()
        if report.published:
            engine.update_drafter(learner.published_state_dict(), learner.version)
        reports.append(report)
    return reports


def test_online_drafter_keeps_acceptance_while_frozen_one_drops(drift_run):
    online = [r.acceptance_before for r in drift_run]
    frozen = [r.acceptance_frozen_shadow for r in drift_run]
    table = "\n".join(f"v{i}: online {o:.3f} frozen {f:.3f}" for i, (o, f) in enumerate(zip(online, frozen)))
    assert frozen[-1] <= frozen[0] - 0.10, table
    assert abs(online[-1] - online[0]) <= 0.05, table


def test_versions_only_move_on_publication(drift_run):
    versions = [r.version for r in drift_run]
    published = [r.published for r in drift_run]
    assert versions == [sum(published[: i + 1]) for i in range(len(published))]
    assert all(r.acceptance_after > r.acceptance_before for r in drift_run if r.published)
    assert any(published)
