"""A drafter is never lost silently on Ray: faults between a publish and a sync, in the learner, in flight and under
a worker each end with every worker serving one drafter version whose digest (computed in each worker over the
weights its engine holds) equals the learner's published one, and acceptance back within 0.05 of before the fault.

Real actors on the session cluster: a controller with a learner and two workers on a target with peaked logits and
a drafter that partly agrees with it (sampled acceptance well above the collapse threshold), its own restart
budget (each test kills something). Every test measures acceptance on one seeded sampled call before and after."""

from __future__ import annotations

import copy
import dataclasses
import time

import pytest
import ray
import torch
from ray.exceptions import ActorUnavailableError, RayActorError
from ray_helpers import make_config, prompts_for
from tiny_models import build_lm

from specroll.integrations.drafter_watch import COLLAPSE_ACCEPTANCE
from specroll.integrations.model_source import ModelPaths
from specroll.integrations.ray_backend.controller import RolloutController
from specroll.integrations.ray_backend.sync.protocol import ObjectStoreTransport
from specroll.online_drafter import LearnerConfig
from specroll.rollout import SamplingParams

LEARNER = LearnerConfig(lr=1e-3, max_steps=4, batch_size=4, holdout_fraction=0.5, warmup_steps=0, gate_z=0.0)
PROMPTS = prompts_for(8)
SAMPLED = SamplingParams(max_new_tokens=24, temperature=1.0, seed=11)
pytestmark = pytest.mark.slow  # a controller with a learner, restarts: minutes on two loaded cores


@pytest.fixture(scope="module")
def controller(ray_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("lifecycle_models")
    target = build_lm(hidden=32, layers=2, seed=0, logit_scale=10.0)
    drafter = copy.deepcopy(target)
    with torch.no_grad():
        drafter.lm_head.weight.add_(0.3 * drafter.lm_head.weight.std() * torch.randn_like(drafter.lm_head.weight))
    target.save_pretrained(root / "target")
    drafter.save_pretrained(root / "drafter")
    config = make_config({"target": str(root / "target"), "drafter": str(root / "drafter")}, max_restarts=10)
    config = dataclasses.replace(config, models=ModelPaths(str(root / "target"), str(root / "drafter")),
                                 learner=LEARNER)
    ctl = RolloutController(config)
    ctl.policy_weights = {k: v.clone() for k, v in target.state_dict().items()}  # re-synced as new versions
    yield ctl
    ctl.shutdown()


def acceptance(controller) -> float:
    controller.generate(PROMPTS, SAMPLED, n=2)
    return controller.batch_stats().acceptance_rate


def served(controller) -> dict[str, object]:
    """Each worker's drafter version and digest, and the learner's published version and digest."""
    workers = controller.workers
    return {"versions": [ray.get(w.versions.remote())["drafter"] for w in workers],
            "digests": [ray.get(w.drafter_digest.remote()) for w in workers],
            "learner_version": ray.get(controller.learner.published_version.remote()),
            "learner_digest": ray.get(controller.learner.published_digest.remote(controller.config.engine.dtype))}


def assert_one_published_drafter(controller) -> None:
    now = served(controller)
    assert now["versions"] == [now["learner_version"]] * 2 == [controller.drafter_version] * 2, now
    assert now["digests"] == [now["learner_digest"]] * 2, now


def publish_a_version(controller) -> int:
    """Rounds until the learner publishes (gate_z 0: a candidate that gained anything); the new version."""
    start = controller.drafter_version
    for _ in range(6):
        controller.generate(PROMPTS, SAMPLED, n=2)
        controller.start_learner_round(None)
        controller.finish_learner_round()
        if controller.drafter_version != start:
            return controller.drafter_version
    pytest.fail(f"the learner published nothing in 6 rounds (version {start})")


def sync_same_policy(controller) -> None:
    controller.sync_policy(controller.policy_weights, controller.policy_version + 1)


def test_a_worker_killed_between_a_publish_and_the_next_sync_reloads_the_drafter_too(controller):
    version = publish_a_version(controller)
    before = acceptance(controller)
    assert before > 5 * COLLAPSE_ACCEPTANCE  # a drafter worth guarding
    ray.kill(controller.workers[1], no_restart=False)
    sync_same_policy(controller)  # waits for the restarted worker, which reloaded policy and drafter from the board
    assert ray.get(controller.workers[1].versions.remote()) == {"policy": controller.policy_version, "drafter": version}
    assert_one_published_drafter(controller)
    assert abs(acceptance(controller) - before) <= 0.05
    assert controller.metrics()["drafter/digest_mismatches"] == 0


def test_a_learner_killed_mid_round_comes_back_from_its_last_state(controller):
    controller.generate(PROMPTS, SAMPLED, n=2)
    controller.start_learner_round(None)
    assert controller.finish_learner_round().report is not None  # a state after a whole round exists
    before, version = acceptance(controller), controller.drafter_version
    given = ray.get(controller.learner.counts.remote())["rollouts"]
    controller.start_learner_round(None)
    ray.kill(controller.learner, no_restart=False)
    done = controller.finish_learner_round()
    assert done.report is None and any("learner actor lost" in event for event in done.events)
    assert controller.drafter_version == version  # the run went on with the drafter it served
    counts = ray.get(controller.learner.counts.remote())
    assert counts["rollouts"] == 2 * len(PROMPTS)  # the batch given since the last state, added again
    assert counts["rollouts"] < given  # a new process: it did not keep the old one's count
    assert_one_published_drafter(controller)
    assert abs(acceptance(controller) - before) <= 0.05
    controller.start_learner_round(None)  # and it learns on
    assert controller.finish_learner_round().report.num_steps > 0


class CorruptingTransport(ObjectStoreTransport):
    """The object-store transport with one byte of the first bucket flipped between the sender and the store."""

    def publish(self, buckets, payload, num_receivers):
        first = buckets[0].numpy().copy()
        first[len(first) // 2] ^= 0xFF
        refs = (ray.put(first), *(ray.put(b.numpy()) for b in list(buckets)[1:]))
        return dataclasses.replace(payload, route=refs)


def test_a_drafter_payload_corrupted_in_flight_is_refused_and_the_version_kept(controller):
    before, old = acceptance(controller), served(controller)
    transport, controller.transport = controller.transport, CorruptingTransport()
    try:
        with pytest.warns(UserWarning, match="refused"):
            version = None
            for _ in range(6):
                controller.generate(PROMPTS, SAMPLED, n=2)
                controller.start_learner_round(None)
                done = controller.finish_learner_round()
                if controller.learner_version != controller.drafter_version:
                    version = controller.learner_version
                    break
        assert version is not None, "the learner published nothing: no payload went out to corrupt"
        assert any("refused" in event and "corrupted in flight" in event for event in done.events)
        kept = served(controller)
        assert kept["versions"] == old["versions"] and kept["digests"] == old["digests"]
    finally:
        controller.transport = transport
    after = acceptance(controller)  # the next generate syncs the learner's version again, over a sound transport
    assert controller.drafter_version == version
    assert_one_published_drafter(controller)
    assert abs(after - before) <= 0.05


def scramble_drafter(controller, index: int, token: int) -> None:
    """What users see after a refit gone wrong: the drafter's weights replaced in place on worker `index`, its
    version unchanged. The drafter then proposes `token` whatever the context."""

    def lose_weights(worker):
        model = worker.models["drafter"]
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.zero_()
                if "norm" in name or name.endswith("embed_tokens.weight"):
                    param.fill_(1.0)
            model.lm_head.weight[token] = 1.0

    ray.get(controller.workers[index].__ray_call__.remote(lose_weights))


def test_a_worker_restarted_while_idle_is_checked_at_the_next_generate(controller):
    before = acceptance(controller)  # and every worker's process is known from its batch
    victim = controller.workers[0]
    pid = ray.get(victim.__ray_call__.remote(lambda _: __import__("os").getpid()))
    ray.kill(victim, no_restart=False)
    deadline = time.monotonic() + 60
    while True:  # until Ray restarted it: another process answers
        try:
            if ray.get(victim.__ray_call__.remote(lambda _: __import__("os").getpid())) != pid:
                break
        except (ActorUnavailableError, RayActorError):
            assert time.monotonic() < deadline, "the killed worker was not restarted within 60 s"
        time.sleep(0.2)
    scramble_drafter(controller, 0, token=0)  # the restarted worker serves something else than it reloaded
    mismatches = controller.metrics()["drafter/digest_mismatches"]
    controller.generate(PROMPTS, SAMPLED, n=2)
    assert controller.metrics()["drafter/digest_mismatches"] == mismatches + 1
    assert any(e.startswith("after worker restart: worker 0") for e in controller.watch.events), controller.watch.events
    assert_one_published_drafter(controller)
    assert abs(acceptance(controller) - before) <= 0.05


def test_a_drafter_that_collapses_under_a_worker_raises_the_alarm_and_is_reverted(controller):
    sync_same_policy(controller)  # a drafter event: its first batch is judged
    before = acceptance(controller)  # judged, fine: the check disarms
    sync_same_policy(controller)
    baseline = controller.generate(PROMPTS, SAMPLED, n=2)
    sync_same_policy(controller)
    unused = sorted(set(range(64)) - {t for r in baseline for t in r.completion_ids})
    assert unused, "every token was sampled: no token the target gives ~0 probability"
    token = unused[0]

    scramble_drafter(controller, 0, token)
    alarms, version = controller.metrics()["drafter/collapse_alarms"], controller.drafter_version
    controller.generate(PROMPTS, SAMPLED, n=2)  # the first batch after the sync: worker 0 collapsed
    assert controller.metrics()["drafter/collapse_alarms"] == alarms + 1
    assert controller.metrics()["drafter/digest_mismatches"] >= 1  # and its digest gave it away: reloaded
    assert controller.drafter_version == version + 1  # the watchdog's revert, a new version
    events = controller.watch.events
    assert any(e.startswith("ALARM drafter collapse") and "worker 0" in e for e in events), events
    assert_one_published_drafter(controller)
    assert abs(acceptance(controller) - before) <= 0.05


def test_after_a_resume_every_worker_serves_the_learner_state_it_was_given(controller):
    saved_version = controller.drafter_version
    before = acceptance(controller)
    state = controller.state_dict()
    assert len(state["engines"]) == 2 and state["learner"]["version"] == saved_version
    publish_a_version(controller)  # the run goes on past its checkpoint, then is taken back to it
    controller.load_state_dict(state)
    assert ray.get(controller.learner.published_version.remote()) == saved_version
    assert controller.learner_version == saved_version
    assert_one_published_drafter(controller)
    assert abs(acceptance(controller) - before) <= 0.05
