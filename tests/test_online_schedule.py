"""Online learning off the critical path: the learner round runs in the background between rollouts,
the probe scores the served drafter on fixed prompts never trained on, and everything lands in the
trainer's logs — through a real GRPOTrainer on the in-process backend, and on the Ray controller."""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
import time

import pytest
import torch

pytest.importorskip("trl")
from datasets import Dataset
from ray_helpers import make_config
from trl import GRPOTrainer
from trl_tiny import grpo_args, length_reward

from specroll.demo.model_cache import load_or_build_demo_models
from specroll.demo.recipe import DemoRecipe
from specroll.demo.task import make_prompts
from specroll.integrations.backend import ProbeRequest
from specroll.integrations.learner_schedule import COLD_UPDATE_FACTOR, LearnerSchedule, ProbeSet
from specroll.integrations.local_backend import LocalBackend
from specroll.integrations.ray_backend.controller import RolloutController
from specroll.integrations.trl_hook.rollout_func import SpecrollRolloutFunc
from specroll.online_drafter import LearnerConfig
from specroll.rollout import EngineConfig, SamplingParams

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
LEARNER = LearnerConfig(lr=1e-3, max_steps=4, batch_size=4, holdout_fraction=0.5)


@pytest.fixture(scope="module")
def demo(tiny_demo_cache):
    return load_or_build_demo_models(DemoRecipe.tiny(), cache_dir=tiny_demo_cache, progress=False)


def backend_for(demo) -> LocalBackend:
    return LocalBackend.from_models(copy.deepcopy(demo.target), copy.deepcopy(demo.drafter),
                                    EngineConfig(max_batch_size=8, max_seq_len=64, gamma=2), LEARNER)


def test_the_round_runs_while_the_caller_goes_on(demo):
    backend = backend_for(demo)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=0)
    backend.generate([[1, 5, 6], [1, 7, 8]], params, n=2)
    gate, entered = threading.Event(), threading.Event()
    train_round = backend.learner.train_round

    def blocked_round(*args):
        entered.set()
        gate.wait(timeout=30)
        return train_round(*args)

    backend.learner.train_round = blocked_round
    backend.start_learner_round(budget_s=5.0)  # returns although the round cannot finish yet
    assert entered.wait(timeout=30)
    gate.set()
    done = backend.finish_learner_round()
    assert done is not None and done.report.num_steps > 0 and done.probe is None
    assert backend.finish_learner_round() is None  # collected once
    assert backend.engine.drafter_version == backend.learner.version


def test_collecting_with_stop_ends_the_rounds_training_now(demo):
    """`finish_learner_round(stop=True)` (what the TRL hook calls: the trainer wants its next rollouts) ends a
    round that had 10 minutes and 10^6 steps to train within a poll of its stop, and the round still gates."""
    backend = LocalBackend.from_models(copy.deepcopy(demo.target), copy.deepcopy(demo.drafter),
                                       EngineConfig(max_batch_size=8, max_seq_len=64, gamma=2),
                                       LearnerConfig(lr=1e-3, max_steps=1_000_000, batch_size=4, holdout_fraction=0.5))
    backend.generate([[1, 5, 6], [1, 7, 8]], SamplingParams(max_new_tokens=8, temperature=1.0, seed=0), n=2)
    trained = threading.Event()
    train = backend.learner.candidate.train

    def watched(draw, loss, *args):
        def counted(model, batch):
            trained.set()
            return loss(model, batch)
        return train(draw, counted, *args)

    backend.learner.candidate.train = watched
    backend.start_learner_round(budget_s=600.0)
    assert trained.wait(timeout=60)  # it is training
    done = backend.finish_learner_round(stop=True)
    assert 0 < done.report.num_steps < 1_000_000 and done.report.train_time_s < 300
    assert done.report.gated  # what it trained is judged


def test_a_round_stopped_before_its_first_step_still_takes_one(demo):
    """A stop that lands before the round's first step (the tiny world: the probe outlasts a 50 ms update) leaves
    the round one step, and the gate judges it: stopped before it, the learner never trained (CI: 0 steps a
    round, the silent-learner alarm on)."""
    backend = LocalBackend.from_models(copy.deepcopy(demo.target), copy.deepcopy(demo.drafter),
                                       EngineConfig(max_batch_size=8, max_seq_len=64, gamma=2),
                                       LearnerConfig(lr=1e-3, max_steps=1_000, batch_size=4, holdout_fraction=0.5))
    backend.generate([[1, 5, 6], [1, 7, 8]], SamplingParams(max_new_tokens=8, temperature=1.0, seed=0), n=2)
    train = backend.learner.candidate.train

    def stopped_already(draw, loss, deadline, clock, stop):
        assert stop is not None  # the round's stop reaches the candidate
        return train(draw, loss, deadline, clock, lambda: True)

    backend.learner.candidate.train = stopped_already
    backend.start_learner_round(budget_s=600.0)
    done = backend.finish_learner_round(stop=True)
    assert done.report.num_steps == 1 and done.report.gated and done.report.alarms == ()


def test_a_probe_is_scored_but_never_trained_on(demo):
    backend = backend_for(demo)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=0)
    backend.generate([[1, 5, 6], [1, 7, 8]], params, n=2)
    seen = len(backend.learner.buffer) + len(backend.learner.holdout)
    backend.start_learner_round(None, ProbeRequest([[1, 9, 9], [1, 4, 4], [1, 3, 3]], params, 2))
    done = backend.finish_learner_round()
    assert done.probe.num_groups == 3 and done.probe.gain == pytest.approx(0.0, abs=1e-9) and done.probe.time_s > 0
    assert len(backend.learner.buffer) + len(backend.learner.holdout) == seen


@pytest.fixture(scope="module")
def trained(demo, tmp_path_factory):
    backend = backend_for(demo)
    schedule = LearnerSchedule(ProbeSet(make_prompts(4, seed=9, max_digits=3), every=2, samples=2))
    trainer = GRPOTrainer(
        model=copy.deepcopy(demo.target), reward_funcs=length_reward,
        args=grpo_args(tmp_path_factory.mktemp("grpo"), max_steps=3),
        train_dataset=Dataset.from_dict({"prompt": make_prompts(8, seed=0, max_digits=3)}),
        processing_class=demo.tokenizer, rollout_func=SpecrollRolloutFunc(backend, schedule=schedule),
    )
    trainer.train()
    return trainer, backend, schedule


def test_rounds_and_probes_reach_the_logs_and_the_report_data(trained):
    trainer, backend, schedule = trained
    steps = [e for e in trainer.state.log_history if "reward" in e]
    # The round started after step s's rollouts is collected at step s + 1's call, logged with it.
    assert all("drafter/learner_wait_s" in e and "drafter/gated" in e for e in steps[1:])
    # a round that only trained (not long enough to be worth scoring) logs no gain: no nan holes
    assert all(("drafter/gain" in e) == bool(e["drafter/gated"]) for e in steps[1:])
    assert [p["step"] for p in schedule.probes] == [0, 2]  # every 2 steps and the last (2), collected at the end
    assert all(0 < p["drafter/probe_online"] <= 1 and p["drafter/probe_gain_se"] >= 0 for p in schedule.probes)
    assert backend._round_result is None  # the last round was collected when train() ended
    assert backend.engine.drafter_version == backend.learner.version
    assert schedule.times.round_s > 0 and schedule.times.rollout_s > 0 and schedule.times.probe_s > 0


def test_the_budget_is_a_share_of_the_rollout_and_of_the_update():
    schedule = LearnerSchedule(rollout_share=0.25, update_share=0.5)
    schedule.rollout_done(8.0, started_at=0.0)
    assert schedule.budget() == pytest.approx(2.0)  # no update measured yet: the rollout's share
    schedule._update_s = 3.0
    assert schedule.budget() == pytest.approx(1.5)


def test_the_rollout_share_counts_over_the_run_so_a_round_uses_what_earlier_ones_left():
    schedule = LearnerSchedule(rollout_share=0.25, update_share=1.0)
    schedule._update_s = 100.0
    schedule.rollout_done(8.0, started_at=0.0)
    schedule.times.round_s += 0.5  # the first round stopped early: 1.5 s of its 2 s left over
    schedule.rollout_done(4.0, started_at=10.0)
    assert schedule.budget() == pytest.approx(0.25 * 12.0 - 0.5)  # 2.5 s, not the last rollout's 1 s
    schedule.times.round_s += 2.5
    assert schedule.budget() == 0.0  # spent: the total stays at a quarter of the rollout time


def test_the_update_a_round_overlaps_is_predicted_from_its_batch_tokens():
    schedule = LearnerSchedule(rollout_share=1.0, update_share=0.5)
    schedule.rollout_done(100.0, started_at=0.0, tokens=1000)
    schedule.round_started()
    schedule._started_at -= 20.0  # the update of that 1000-token batch took 20 s
    schedule.round_collected(None)
    schedule.rollout_done(100.0, started_at=30.0, tokens=400)  # a batch of 400 tokens: an update of ~8 s
    assert schedule.predicted_update_s() == pytest.approx(8.0, rel=0.05)
    assert schedule.budget() == pytest.approx(4.0, rel=0.05)
    schedule.rollout_done(100.0, started_at=60.0)  # no token count: the last update's length
    assert schedule.predicted_update_s() == pytest.approx(20.0, rel=0.05)


def test_a_cold_start_decoding_plainly_trains_in_the_whole_update_and_apart_from_the_share():
    from types import SimpleNamespace

    from specroll.integrations.backend import LearnerRound
    from specroll.integrations.learner_schedule import REPORT_FIELDS

    def step(schedule, drafted: bool, round_s: float) -> float:
        schedule.rollout_done(4.0, started_at=0.0)
        schedule.speculation_seen(1, SimpleNamespace(spec_row_steps=int(drafted), drafter_forwards=int(drafted)))
        budget = schedule.budget()
        schedule.round_started()
        report = SimpleNamespace(**{**dict.fromkeys(REPORT_FIELDS, 0.0), "round_time_s": round_s, "gated": False,
                                    "published": False, "event": None, "alarms": [], "alarms_active": 0,
                                    "budget_s": budget, "policy_version": 1})
        schedule._started_at -= 20.0  # the policy update took 20 s
        schedule.round_collected(LearnerRound(report=report, probe=None, wait_s=0.0, events=[]))
        return budget

    cold = LearnerSchedule(rollout_share=0.25, update_share=0.9, speculation_events=True)
    assert step(cold, drafted=False, round_s=1.0) == pytest.approx(1.0)  # no update measured yet: the share
    assert cold._update_s == pytest.approx(20.0, abs=0.5)
    assert step(cold, drafted=False, round_s=17.0) == pytest.approx(COLD_UPDATE_FACTOR * cold._update_s, rel=0.05)
    assert cold.times.cold_round_s == pytest.approx(17.0) and cold.times.round_s == pytest.approx(1.0)
    # speculating: the share again, which the cold rounds did not spend (0.25 * 12 s - 1 s)
    assert step(cold, drafted=True, round_s=0.5) == pytest.approx(2.0)
    for shared in (LearnerSchedule(rollout_share=0.25, update_share=0.9),  # not a cold start
                   LearnerSchedule(rollout_share=0.25, update_share=0.9, speculation_events=True,
                               cold_uses_update=False)):
        step(shared, drafted=False, round_s=1.0)
        assert step(shared, drafted=False, round_s=1.0) == pytest.approx(0.25 * 8.0 - 1.0)


def test_ray_collecting_with_stop_ends_the_actors_round_now(ray_cluster, tiny_model_paths):
    """The stop reaches a round running on the learner actor (`round_stop`: the cluster's key-value store): a
    round with 10 minutes and 10^6 steps returns within minutes (at least one step: a stop before the first
    leaves it one); its key is gone after."""
    from ray.experimental import internal_kv

    from specroll.integrations.ray_backend import round_stop

    config = make_config(tiny_model_paths, num_workers=1, online_learning=True)
    config = dataclasses.replace(config, learner=LearnerConfig(max_steps=1_000_000, batch_size=4))
    controller = RolloutController(config)
    try:
        params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=0)
        controller.generate([[1, 5, 6], [1, 7, 8], [2, 3, 4]], params, n=2)
        controller.start_learner_round(600.0)
        key = controller.learner_driver._stop_key
        time.sleep(5.0)  # the actor takes the round and trains
        done = controller.finish_learner_round(stop=True)
        assert 1 <= done.report.num_steps < 1_000_000 and done.report.train_time_s < 300
        assert internal_kv._internal_kv_get(key, namespace=round_stop.NAMESPACE) is None
    finally:
        controller.shutdown()


def test_ray_controller_runs_the_round_and_the_probe_on_its_actors(ray_cluster, tiny_model_paths):
    controller = RolloutController(make_config(tiny_model_paths, num_workers=1, online_learning=True))
    try:
        params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=0)
        controller.generate([[1, 5, 6], [1, 7, 8], [2, 3, 4]], params, n=2)
        controller.start_learner_round(5.0, ProbeRequest([[9, 9, 1], [4, 4, 1]], params, 2))
        done = controller.finish_learner_round()
        assert done.report.num_steps > 0
        assert done.probe.num_groups == 2 and done.probe.gain == pytest.approx(0.0, abs=1e-9)
        assert controller.finish_learner_round() is None
        published = controller.published_drafter()
        assert published.number == controller.drafter_version
        assert all(isinstance(t, torch.Tensor) for t in published.weights.values())
    finally:
        controller.shutdown()
