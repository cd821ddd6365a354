"""A learner saved after some rounds and loaded in a fresh process state goes on exactly as the one that was
never stopped: the same next round, bit for bit (the state `specroll train --resume` keeps beside a trainer
checkpoint: `online_drafter.state.learner_state`)."""

from __future__ import annotations

import copy
import dataclasses

import torch
from online_fixtures import tiny_llama

from specroll.online_drafter import DraftLearner, LearnerConfig
from specroll.online_drafter.state.learner_state import restore, state_of
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

V = 32


def rollouts(engine: SpecEngine, seed: int, policy_version: int) -> list:
    engine.policy_version = policy_version
    return engine.generate([[i % V, (3 * i + seed) % V] for i in range(8)],
                           SamplingParams(max_new_tokens=8, temperature=1.0, seed=seed), n=2)


def weights(learner: DraftLearner) -> dict[str, torch.Tensor]:
    models = {"published": learner.published, "frozen": learner.frozen, "candidate": learner.candidate.model,
              "averaged": learner.candidate.averaged}
    return {f"{where}.{name}": p.detach() for where, model in models.items() for name, p in model.named_parameters()}


def test_a_loaded_learner_runs_the_next_round_as_the_one_never_stopped(tmp_path):
    target, drafter = tiny_llama(32, 2, seed=0), tiny_llama(16, 1, seed=1)
    engine = SpecEngine(target, copy.deepcopy(drafter), EngineConfig(max_batch_size=16, max_seq_len=32, gamma=2,
                                                                     record_signals=True, signal_top_k=8))
    config = LearnerConfig(lr=1e-2, max_steps=4, batch_size=4, seed=3, holdout_fraction=0.25, gate_z=0.0,
                           warmup_steps=2, alarm_rounds=3, alarm_min_steps=13)
    batches = [rollouts(engine, seed, version) for version, seed in enumerate((11, 12, 13, 14))]
    learner = DraftLearner(drafter, config)
    learner.set_draft_vocab(torch.arange(24), V)
    for batch in batches[:2]:
        learner.add_rollouts(batch)
        learner.train_round()
    learner.probe(rollouts(engine, 99, 1))
    learner.save(tmp_path / "learner.pt")
    resumed = DraftLearner.load(tmp_path / "learner.pt", tiny_llama(16, 1, seed=7))
    assert resumed.config == config and resumed.version == learner.version
    for batch in batches[2:]:
        reports = []
        for each in (learner, resumed):
            each.add_rollouts(batch)
            reports.append(each.train_round())
        # seconds differ, and the alarm messages quote them: compared by what they say before the numbers
        timeless = [{k: v for k, v in dataclasses.asdict(r).items() if not k.endswith("_s") and k != "alarms"}
                    for r in reports]
        assert timeless[0] == timeless[1]
        kinds = [[alarm.split(":")[0] for alarm in r.alarms] for r in reports]
        assert kinds[0] == kinds[1]
        assert reports[0].num_steps == 4  # it trained: the comparison covers the optimizer and the batches drawn
    assert learner.version > 0  # a publish happened: the version and the published weights are compared too
    for name, tensor in weights(learner).items():
        assert torch.equal(tensor, weights(resumed)[name]), name
    assert torch.equal(learner.draft_vocab("candidate"), resumed.draft_vocab("candidate"))
    # 12 steps in the last 3 rounds < 13: stalled, which the resumed learner knows only from the rounds before it
    assert learner.alarms.holding == resumed.alarms.holding == {"stalled"}


def test_a_resumed_learner_keeps_its_own_settings_and_the_buffer_it_had(tmp_path):
    target, drafter = tiny_llama(32, 2, seed=0), tiny_llama(16, 1, seed=1)
    engine = SpecEngine(target, copy.deepcopy(drafter), EngineConfig(max_batch_size=16, max_seq_len=32, gamma=2,
                                                                     record_signals=True, signal_top_k=8))
    learner = DraftLearner(drafter, LearnerConfig(max_steps=1, batch_size=4))
    learner.add_rollouts(rollouts(engine, 5, 0))
    learner.train_round()
    changed = dataclasses.replace(learner.config, max_steps=7, buffer=dataclasses.replace(learner.config.buffer,
                                                                                         max_positions=10_000))
    fresh = DraftLearner(tiny_llama(16, 1, seed=1), changed)
    restore(fresh, state_of(learner), "test")
    assert fresh.config.max_steps == 7 and fresh.buffer.config.max_positions == 10_000
    assert fresh.buffer.num_positions == learner.buffer.num_positions > 0


def test_a_loaded_holdout_set_sends_a_group_met_again_where_it_went_first():
    from specroll.online_drafter.gate.holdout import HoldoutSet

    entry = type("Entry", (), {"num_positions": 1})
    saved = HoldoutSet(fraction=0.5, max_positions=100)
    keys = [(3, (i,)) for i in range(4)]
    first = [saved.offer(entry(), key) for key in keys]
    assert first == [True, False, True, False]
    loaded = HoldoutSet(fraction=0.5, max_positions=100)
    state = saved.state_dict()
    state["entries"] = [{} for _ in state["entries"]]
    loaded.load_state_dict(state, entry)
    again = [loaded.offer(entry(), key) for key in [keys[1], keys[0], keys[3], (3, (9,))]]
    assert again == [False, True, False, saved.offer(entry(), (3, (9,)))]  # the new group decided as the saver would
