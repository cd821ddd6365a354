"""Under a controlled policy drift the online drafter keeps its acceptance; a frozen one loses it.

Setup (CPU, fixed seeds): a tiny Llama target pretrained on a Markov chain, a smaller drafter
distilled from it. The policy then drifts toward a reweighted, sharper chain (`shifted_chain`, like
an RL update) a couple of AdamW steps per version; each version: rollouts (T = 1, γ = 3, signals on)
→ `add_rollouts` → `train_round` → publish to the engine if better → next policy update.

Drift is measured as the product measures it: on a fixed probe set of prompts, fresh samples at each
policy version, never trained on, scored *before* the round that learns from that version
(`DraftLearner.probe`): the drafter that actually served that version, trained only on older ones —
the one-version lag of the real pipeline, where the learner trains while the trainer updates the
policy — paired with the frozen drafter on the same positions.
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
    probe_prompts = sample_sequences(chain, 16, 2, g).tolist()
    reports, probes = [], []
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
        params = SamplingParams(max_new_tokens=32, temperature=1.0, seed=version)
        probes.append(learner.probe(engine.generate(probe_prompts, params, n=2)))
        learner.add_rollouts(engine.generate(prompts, params))
        report = learner.train_round()
        if report.published:
            engine.load_drafter(learner.published_version())
        reports.append(report)
    return reports, probes


def test_online_drafter_keeps_acceptance_while_frozen_one_drops(drift_run):
    _, probes = drift_run
    online = [p.served for p in probes]
    frozen = [p.frozen for p in probes]
    table = "\n".join(f"v{i}: online {o:.3f} frozen {f:.3f}" for i, (o, f) in enumerate(zip(online, frozen)))
    assert frozen[-1] <= frozen[0] - 0.10, table
    # The served drafter lags the policy by a version or two (a rejected round waits for the next):
    # judged on the last two probes.
    assert abs((online[-1] + online[-2]) / 2 - online[0]) <= 0.05, table
    last = probes[-1]
    assert last.gain - 1.96 * last.gain_se > 0, table  # online beats frozen, interval excluding 0


def test_versions_only_move_on_publication(drift_run):
    reports, _ = drift_run
    versions = [r.version for r in reports]
    published = [r.published for r in reports]
    assert versions == [sum(published[: i + 1]) for i in range(len(published))]  # no probe reverted
    assert all(r.gain > 0 for r in reports if r.published and r.event is None)
    assert any(published)
