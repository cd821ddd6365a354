"""DraftLearner: the loss and metric, held-out split, the paired gate, the watchdog, the target untouched, resume."""

from __future__ import annotations

import copy
import dataclasses
import types

import pytest
import torch
from online_fixtures import tiny_llama

from specroll.online_drafter import DraftLearner, LearnerConfig, bucketed_kl, bucketed_tv, expected_acceptance
from specroll.online_drafter.batching import length_batches
from specroll.online_drafter.gate.candidate import weights_of
from specroll.online_drafter.lm.data import to_buffered
from specroll.online_drafter.lm.scorer import DrafterScorer
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

V = 32


@pytest.fixture(scope="module")
def setup():
    target, drafter = tiny_llama(32, 2, seed=0), tiny_llama(16, 1, seed=1)
    engine = SpecEngine(target, copy.deepcopy(drafter), EngineConfig(max_batch_size=20, max_seq_len=32, gamma=2,
                                                                     record_signals=True, signal_top_k=8))
    prompts = [[i % V, (3 * i) % V] for i in range(20)]
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=1.0, seed=0))
    return engine, drafter, rollouts


def small_config(**overrides) -> LearnerConfig:
    return LearnerConfig(**{"lr": 1e-2, "max_steps": 10, "batch_size": 8, "seed": 0, **overrides})


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="loss"):
        LearnerConfig(loss="js")
    with pytest.raises(ValueError, match="holdout_fraction"):
        LearnerConfig(holdout_fraction=1.0)


def test_divergences_on_exact_and_tail_heavy_q():
    torch.manual_seed(0)
    p = torch.randn(2, 5, V).softmax(-1)
    top = p.topk(V, dim=-1)  # k = V: no tail, the metric is exact
    log_p = p.log()
    assert torch.allclose(expected_acceptance(log_p, top.indices, top.values), torch.ones(2, 5), atol=1e-5)
    assert bucketed_kl(log_p, top.indices, top.values).abs().max() < 1e-5
    top4 = p.topk(4, dim=-1)
    q = torch.full_like(p, 1.0 / V)
    q_exact = (1 - top4.values.sum(-1, keepdim=True)) / (V - 4) * torch.ones_like(p)
    q_exact = q_exact.scatter(-1, top4.indices, top4.values)  # p on the top-4, p's tail spread evenly
    assert bucketed_kl(q_exact.log(), top4.indices, top4.values).abs().max() < 1e-5
    assert (bucketed_kl(q.log(), top4.indices, top4.values) > 1e-3).all()  # uniform q wastes mass in the tail
    full = torch.minimum(p, q).sum(-1)
    assert (expected_acceptance(q.log(), top4.indices, top4.values) <= full + 1e-6).all()  # a lower bound
    assert torch.allclose(bucketed_tv(q_exact.log(), top4.indices, top4.values), torch.zeros(2, 5), atol=1e-5)


def test_holdout_is_a_stride_of_prompt_groups_kept_across_versions(setup):
    _, drafter, rollouts = setup
    learner = DraftLearner(drafter, small_config(holdout_fraction=0.25))
    learner.add_rollouts(rollouts)
    assert len(learner.holdout) == 5 and len(learner.buffer) == 15
    newer = copy.copy(rollouts[0])
    newer.policy_version = 1
    learner.add_rollouts([newer])  # the 21st group: a stride of 4 holds it out, next to version 0's
    assert len(learner.holdout) == 6 and len(learner.buffer) == 15
    assert {v for v, _ in learner.holdout.keys} == {0, 1}


def test_held_out_groups_that_no_longer_weigh_go_to_training(setup):
    _, drafter, rollouts = setup
    # decay 0.5, floor 0.2: versions newest-2.. weigh 1, 0.5, 0.25 and stay; older ones leave
    learner = DraftLearner(drafter, small_config(holdout_fraction=0.25, holdout_recency_decay=0.5,
                                                 holdout_min_weight=0.2))
    for version in range(5):
        learner.add_rollouts([dataclasses.replace(r, policy_version=version) for r in rollouts])
    assert {v for v, _ in learner.holdout.keys} == {2, 3, 4}
    assert len(learner.holdout) == 15 and len(learner.buffer) == 100 - 15  # nothing is lost
    score_all = DraftLearner(drafter, small_config(holdout_fraction=0.25, holdout_min_weight=0.0))
    for version in range(5):
        score_all.add_rollouts([dataclasses.replace(r, policy_version=version) for r in rollouts])
    assert len(score_all.holdout) == 25


def test_target_parameters_bit_identical_after_learner_rounds(setup):
    engine, drafter, rollouts = setup
    before = {n: p.detach().clone() for n, p in engine.target.model.named_parameters()}
    learner = DraftLearner(drafter, small_config())
    learner.add_rollouts(rollouts)
    for _ in range(2):
        learner.train_round()
    target_ptrs = {p.data_ptr() for p in engine.target.model.parameters()}
    learner_ptrs = {p.data_ptr() for m in (learner.candidate.model, learner.frozen) for p in m.parameters()}
    assert not target_ptrs & learner_ptrs  # the learner does not even hold the target
    for name, param in engine.target.model.named_parameters():
        assert torch.equal(param, before[name]), name


def test_a_rejected_candidate_keeps_training_and_the_published_drafter_stays(setup):
    _, drafter, rollouts = setup
    learner = DraftLearner(drafter, small_config(min_improvement=1.0))  # no round can clear this
    learner.add_rollouts(rollouts)
    published_before = {n: t.clone() for n, t in learner.published_state_dict().items()}
    first = learner.train_round()
    assert not first.published and first.version == learner.version == 0
    assert first.num_steps == 10 and first.num_positions > 0
    assert first.acceptance_frozen_shadow == pytest.approx(first.acceptance_before)
    for name, tensor in learner.published_state_dict().items():
        assert torch.equal(tensor, published_before[name])
    candidate = {n: p.detach().clone() for n, p in learner.candidate.model.named_parameters()}
    assert any(not torch.equal(candidate[n], published_before[n]) for n in candidate)  # not reset
    second = learner.train_round()
    assert second.acceptance_after > first.acceptance_after  # gains accumulate over rejected rounds


def test_publishes_when_the_paired_gain_clears_the_interval(setup):
    engine, drafter, rollouts = setup
    learner = DraftLearner(drafter, small_config(max_steps=30))
    learner.add_rollouts(rollouts)
    report = learner.train_round()
    assert report.published and report.version == learner.version == 1
    assert report.gain - learner.config.gate_z * report.gain_se > 0
    assert report.gain == pytest.approx(report.acceptance_after - report.acceptance_before, abs=1e-6)
    engine.update_drafter(learner.published_state_dict(), learner.version)
    assert learner.score(engine.drafter.runner.model) == pytest.approx(report.acceptance_after, abs=1e-5)


def test_watchdog_reverts_a_served_drafter_below_the_frozen_one(setup):
    _, drafter, rollouts = setup
    learner = DraftLearner(drafter, small_config(max_steps=1, lr=1e-9))  # a round that changes nothing
    learner.add_rollouts(rollouts)
    with torch.no_grad():  # the served version (and the candidate, its average) drifted somewhere bad
        for param, average in zip(learner.candidate.model.parameters(), learner.candidate.averaged.parameters()):
            param.add_(0.5 * torch.randn_like(param))
            average.copy_(param)
    learner._set_published(weights_of(learner.candidate.averaged))
    report = learner.train_round()
    assert report.published and report.version == 1
    assert "below the frozen drafter" in report.event and "reverted to the frozen drafter" in report.event
    assert report.acceptance_frozen_shadow > report.acceptance_before
    for name, param in learner.frozen.named_parameters():
        assert torch.equal(learner.published_state_dict()[name], param)
        assert torch.equal(dict(learner.candidate.model.named_parameters())[name], param)


def test_watchdog_reverts_below_break_even(setup):
    _, drafter, rollouts = setup
    learner = DraftLearner(drafter, small_config(max_steps=5))
    learner.add_rollouts(rollouts)
    report = learner.train_round(break_even=1.01)  # nothing reaches it: the best known is published
    assert "break-even" in report.event


def test_watchdog_keeps_a_served_drafter_that_is_still_the_frozen_one(setup):
    """Nothing reaches break-even and served == frozen: no new version, and the candidate keeps training
    (a tie used to republish the frozen drafter and restart the candidate, losing what it had learnt)."""
    _, drafter, rollouts = setup
    learner = DraftLearner(drafter, small_config(max_steps=5, lr=10.0, ema_decay=0.0, reset_margin=1.0))
    learner.add_rollouts(rollouts)
    report = learner.train_round(break_even=1.01)
    assert "kept it" in report.event and report.version == learner.version == 0
    frozen = dict(learner.frozen.named_parameters())
    assert any(not torch.equal(p, frozen[n]) for n, p in learner.candidate.model.named_parameters())


def test_a_due_gate_runs_where_it_does_not_fit_the_round(setup, monkeypatch):
    """Rounds whose budget is below one gate's cost still gate once the candidate has trained that long
    (virtual clock: a training forward costs 10 ms, a scoring forward 30 ms); the overrun is one gate."""
    _, drafter, rollouts = setup
    clock = types.SimpleNamespace(t=0.0)
    learner = DraftLearner(drafter, small_config(max_steps=1000))
    learner.clock = lambda: clock.t
    log_q = learner.scorer.log_q

    def timed_log_q(model, batch):
        clock.t += 0.01 if torch.is_grad_enabled() else 0.03
        return log_q(model, batch)

    monkeypatch.setattr(learner.scorer, "log_q", timed_log_q)
    learner.add_rollouts(rollouts)
    assert learner.train_round(budget_s=0.5).gated  # learns what a gate costs (one scoring batch here)
    reports = [learner.train_round(budget_s=0.02) for _ in range(8)]  # below a gate's 1.2 x 30 ms
    gated = [r for r in reports if r.gated]
    assert gated and not reports[0].gated, [(r.gated, r.num_steps) for r in reports]
    assert all(r.round_time_s <= 0.02 + 1e-9 for r in reports if not r.gated)
    assert all(r.round_time_s <= 0.02 + 0.036 + 1e-9 for r in gated)


def test_scoring_batches_are_sorted_bounded_and_pad_little():
    lengths = [40, 5, 6, 90, 7, 41, 5, 6, 39, 100, 8, 6]
    batches = length_batches(lengths, max_rows=4, slack=1.25)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat) and all(len(b) <= 4 for b in batches)
    for b in batches:
        padded, real = len(b) * max(lengths[i] for i in b), sum(lengths[i] for i in b)
        assert padded <= 1.25 * real
    assert length_batches([], 4) == []


def test_probe_scores_served_and_frozen_paired_without_buffering(setup):
    _, drafter, rollouts = setup
    learner = DraftLearner(drafter, small_config())
    learner.add_rollouts(rollouts)
    buffered = len(learner.buffer) + len(learner.holdout)
    probe = learner.probe(rollouts)
    assert len(learner.buffer) + len(learner.holdout) == buffered
    assert probe.gain == pytest.approx(0.0, abs=1e-9) and probe.served == pytest.approx(probe.frozen)
    assert probe.num_groups == 20 and probe.event is None


def test_a_harmful_learning_rate_never_serves_a_drafter_worse_than_frozen(setup):
    """lr = 10 wrecks every candidate (judged unaveraged): the gate must refuse them all (checked on a probe
    each round)."""
    engine, drafter, _ = setup
    learner = DraftLearner(drafter, small_config(lr=10.0, max_steps=20, ema_decay=0.0))
    prompts = [[i % V, (5 * i + 1) % V] for i in range(16)]
    probe_prompts = [[(7 * i + 3) % V, i % V] for i in range(8)]
    engine.update_drafter(learner.published_state_dict(), learner.version)
    gains = []
    for round_index in range(4):
        params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=100 + round_index)
        learner.add_rollouts(engine.generate(prompts, params, n=2))
        report = learner.train_round()
        gains.append(report.gain)
        if report.published:
            engine.update_drafter(learner.published_state_dict(), learner.version)
        probe = learner.probe(engine.generate(probe_prompts, params, n=2))
        assert probe.gain + learner.config.gate_z * probe.gain_se >= 0, (round_index, report, probe)
    assert min(gains) < -0.05, gains  # the setting is harmful: candidates lost to what was served


def test_save_and_load_resume_the_same_run(setup, tmp_path):
    _, drafter, rollouts = setup
    learner = DraftLearner(drafter, small_config())
    learner.add_rollouts(rollouts)
    learner.train_round()
    learner.save(tmp_path / "learner.pt")
    resumed = DraftLearner.load(tmp_path / "learner.pt", tiny_llama(16, 1, seed=7))
    assert resumed.version == learner.version
    assert resumed.score(resumed.frozen) == pytest.approx(learner.score(learner.frozen), abs=1e-6)
    a, b = learner.train_round(), resumed.train_round()
    assert a.published == b.published and a.version == b.version
    assert a.acceptance_after == pytest.approx(b.acceptance_after, abs=1e-5)


def test_scoring_batched_by_length_keeps_each_entry_its_own_score(setup):
    """Entries of 3..12 positions scored together (batched by length) == each scored alone."""
    _, drafter, rollouts = setup
    entries = []
    for i, rollout in enumerate(rollouts[:10]):
        e, n = to_buffered(rollout), 12 - i
        entries.append(dataclasses.replace(e, token_ids=e.token_ids[: e.prompt_len + n], topk_ids=e.topk_ids[:n],
                                           topk_probs=e.topk_probs[:n], rejected=e.rejected[:n]))
    scorer = DrafterScorer(1.0, 4, 0.5, torch.device("cpu"))
    together = scorer.score_entries(drafter, entries)
    alone = torch.cat([scorer.score_entries(drafter, [e]) for e in entries])
    assert together[:, 1].tolist() == [float(12 - i) for i in range(10)]
    assert torch.allclose(together, alone, atol=1e-5)
