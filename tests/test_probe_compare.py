"""Two runs' served drafters compared paired on the same probe positions (`tools.probe_compare`), from
the per-group scores every probe records through the public path (backend round -> LearnerSchedule)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_head_online import ENGINE, LEARNER, grpo_steps
from tiny_models import tiny_lm

from specroll.integrations.local_backend import LocalBackend
from specroll.rollout.drafters.heads import EagleHead
from specroll.tools.probe_compare import compare, load_probes, table


def probes_of_a_run(head_seed: int, steps: int = 2) -> list[dict]:
    target = tiny_lm("llama", "sdpa", layers=2, logit_scale=10.0)
    policy = {n: p.detach().clone() for n, p in target.named_parameters()}
    config = dataclasses.replace(LEARNER, max_steps=10)
    engine = dataclasses.replace(ENGINE, sampler="invariant")  # the same GRPO run whatever the head
    backend = LocalBackend.from_models(target, EagleHead.for_target(target.config, seed=head_seed), engine, config)
    try:
        _, schedule = grpo_steps(backend, backend.engine.target.model, steps=steps)
    finally:
        backend.shutdown()
        with torch.no_grad():  # the session-cached target: back to its own weights
            for name, param in target.named_parameters():
                param.copy_(policy[name])
    return json.loads(json.dumps(schedule.probes))  # as probes.jsonl holds them


def test_two_runs_that_differ_in_the_drafter_compare_paired_on_the_same_positions(tmp_path):
    a, b = probes_of_a_run(head_seed=1), probes_of_a_run(head_seed=2)
    for probe in a:  # the per-group scores are the logged probe's own
        assert sum(probe["served_group_sums"]) / sum(probe["group_counts"]) == \
            pytest.approx(probe["drafter/probe_online"], abs=1e-9)
    (tmp_path / "probes.jsonl").write_text("".join(json.dumps(p) + "\n" for p in a))
    rows = compare(load_probes(tmp_path), b)
    assert [r.step for r in rows] == [0, 1]
    for row, pa, pb in zip(rows, a, b, strict=True):
        assert row.a == pytest.approx(pa["drafter/probe_online"]) and row.b == pytest.approx(pb["drafter/probe_online"])
        assert row.gain.mean == pytest.approx(row.a - row.b) and 0 < row.gain.se < 1
    assert all(r.gain.mean == 0 and r.gain.se == 0 for r in compare(a, a))
    assert table(rows, "a", "b").splitlines()[0] == "| policy step | a | b | a − b (paired s.e.) |"


def test_probes_of_other_positions_or_without_group_scores_are_refused(tmp_path):
    probe = {"step": 0, "served_group_sums": [3.0, 4.0], "group_counts": [4.0, 5.0]}
    with pytest.raises(ValueError, match="cover other positions"):
        compare([probe], [{**probe, "group_counts": [4.0, 6.0]}])
    with pytest.raises(ValueError, match="no per-group scores"):
        compare([probe], [{**probe, "served_group_sums": None}])
    with pytest.raises(ValueError, match="share no probed step"):
        compare([probe], [{**probe, "step": 5}])
    with pytest.raises(ValueError, match=r"not a report's probes\.jsonl"):
        load_probes(tmp_path)
