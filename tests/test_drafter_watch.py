"""The drafter checks' rules without Ray: the weights digest (the same weights hash the same wherever, in the wire
dtype; any changed byte or name changes it) and the collapse rule of the first batch after a drafter event."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_lm

from specroll.integrations.drafter_watch import MIN_DRAFTED, MIN_ESTIMATE, DrafterWatch
from specroll.rollout.core.stats import BatchStats, DrafterStats
from specroll.rollout.drafters.version import drafter_digest


def weights() -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in build_lm(hidden=16, layers=1, seed=3).named_parameters()}


def test_a_digest_is_the_weights_not_their_order_or_copy():
    named = weights()
    assert drafter_digest(named) == drafter_digest(dict(reversed(list(named.items()))))
    assert drafter_digest(named) == drafter_digest(dict(build_lm(hidden=16, layers=1, seed=3).named_parameters()))


def test_one_changed_value_or_name_changes_the_digest():
    named, digest = weights(), drafter_digest(weights())
    name = next(iter(named))
    flipped = {**named, name: named[name].clone()}
    flipped[name].view(-1)[0] += 1e-6
    renamed = {("x" + k if k == name else k): v for k, v in named.items()}
    assert drafter_digest(flipped) != digest and drafter_digest(renamed) != digest


def test_an_fp32_learner_and_a_bf16_engine_agree_in_the_wire_dtype():
    named = weights()
    engine = {name: t.to(torch.bfloat16) for name, t in named.items()}
    assert drafter_digest(named, wire_dtype=torch.bfloat16) == drafter_digest(engine, wire_dtype=torch.bfloat16)
    assert drafter_digest(named) != drafter_digest(engine)


def test_the_draft_vocabulary_is_part_of_the_digest():
    named = weights()
    with_vocab = drafter_digest(named, torch.tensor([5, 1, 3]))
    same_ids = torch.tensor([1, 3, 5], dtype=torch.int32)
    assert with_vocab == drafter_digest(named, same_ids) != drafter_digest(named)
    assert with_vocab != drafter_digest(named, torch.tensor([1, 3, 6]))


def test_an_empty_state_is_refused():
    with pytest.raises(ValueError, match="weights is empty"):
        drafter_digest({})


def batch(drafted: int, accepted: int, kind: str = "model") -> BatchStats:
    return BatchStats(drafted=drafted, accepted=accepted, spec_row_steps=drafted // 2,
                      by_drafter={kind: DrafterStats(drafted // 2, drafted, accepted)})


def test_a_digest_mismatch_is_an_event_and_arms_the_collapse_check():
    watch = DrafterWatch()
    assert watch.checked("policy sync", {"worker 0": "aa", "worker 1": "bb"}, "aa", version=2) == ["worker 1"]
    assert watch.pending == "policy sync" and watch.digest_mismatches == 1
    assert "worker 1" in watch.take_events()[0] and watch.events == []


def test_the_first_batch_after_an_event_is_judged_once():
    watch = DrafterWatch()
    assert watch.judge({"worker 0": batch(MIN_DRAFTED, 0)}) == []  # nothing pending: not judged
    watch.checked("drafter publish", {"worker 0": "aa"}, "aa", version=1)
    assert watch.judge({"worker 0": batch(MIN_DRAFTED - 1, 0)}) == []  # too few drafts: still armed
    assert watch.pending == "drafter publish"
    assert watch.judge({"worker 0": batch(MIN_DRAFTED, 40), "worker 1": batch(MIN_DRAFTED, 30)}) == []
    assert watch.pending is None  # judged healthy: disarmed


def test_a_collapse_is_an_alarm_only_where_the_learner_expects_better():
    stats = {"worker 0": batch(MIN_DRAFTED, 40), "worker 1": batch(2 * MIN_DRAFTED, 1)}
    watch = DrafterWatch()
    watch.checked("resume", {"worker 0": "aa", "worker 1": "aa"}, "aa", version=3)
    collapsed = watch.judge(stats)
    assert collapsed == ["worker 1"]
    assert not watch.collapse_confirmed(collapsed, stats, MIN_ESTIMATE / 2, version=3)  # a bad drafter, not a loss
    assert watch.collapse_alarms == 0 and watch.pending is None
    watch.checked("resume", {"worker 0": "aa", "worker 1": "aa"}, "aa", version=3)
    assert watch.collapse_confirmed(watch.judge(stats), stats, 0.6, version=3)
    assert watch.metrics()["drafter/collapse_alarms"] == 1.0
    assert watch.events[-1].startswith("ALARM drafter collapse after resume: worker 1 kept 1 of 128 drafts")


def test_model_free_drafts_are_not_judged():
    watch = DrafterWatch()
    watch.checked("drafter publish", {"worker 0": "aa"}, "aa", version=1)
    suffix_only = batch(4 * MIN_DRAFTED, 0, kind="suffix")
    assert watch.judge({"worker 0": suffix_only}) == [] and watch.pending == "drafter publish"


def test_the_backend_events_of_a_round_reach_the_run_events_and_alarms(capsys):
    from specroll.integrations.backend import LearnerRound
    from specroll.integrations.learner_schedule import LearnerSchedule

    schedule = LearnerSchedule()
    schedule.round_started()
    schedule.round_collected(LearnerRound(None, None, 0.0, ["learner actor lost", "ALARM drafter collapse after x"]))
    assert schedule.events == ["learner actor lost", "ALARM drafter collapse after x"]
    assert schedule.alarms == ["drafter collapse after x"]
    assert "drafter collapse after x" in capsys.readouterr().err
