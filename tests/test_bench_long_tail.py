"""`specroll bench --workload long-tail` on tiny models, through the CLI: budgets at the stated quantiles, every
contender in lockstep with plain in its group, every row run to its budget, and phase shares that add up."""

from __future__ import annotations

import json
import math
import re

import pytest

from specroll.bench.long_tail import lognormal_quantile, long_tail_budgets, percentile
from specroll.cli import main
from specroll.rollout import SpecEngine

REQUESTS, SLOTS, SMALL_BATCH = 16, 6, 2
SHRUNK = ["--models", "tiny", "--threads", "1", "--long-tail-requests", str(REQUESTS), "--long-tail-samples", "4",
          "--long-tail-slots", str(SLOTS), "--long-tail-max-seq-len", "80", "--long-tail-median", "6",
          "--long-tail-sigma", "1.2", "--long-tail-small-batch", str(SMALL_BATCH), "--long-tail-fixed-gamma", "2",
          "--long-tail-repeats", "2", "--long-tail-group", "3", "--long-tail-trees", "2"]
CONTENDERS = ["plain", "model", "suffix", "suffix+model", "layer_skip", "eagle", "medusa", "model_gamma2",
              "model_trees2"]


def _log_steps(monkeypatch) -> list[tuple[SpecEngine, int, int | None]]:
    """(engine, its generated tokens before the step, after it; None when its generation ended) per step."""
    events: list[tuple[SpecEngine, int, int | None]] = []
    original = SpecEngine.generate_steps

    def logged(self, *args, **kwargs):
        steps = original(self, *args, **kwargs)

        def run():
            while True:
                before = self.stats.generated_tokens
                try:
                    live = next(steps)
                except StopIteration as done:
                    events.append((self, before, None))
                    return done.value
                events.append((self, before, self.stats.generated_tokens))
                yield live

        return run()

    monkeypatch.setattr(SpecEngine, "generate_steps", logged)
    return events


def test_long_tail_workload_races_every_contender_in_lockstep_to_its_budgets(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECROLL_CACHE", str(tmp_path))  # calibrations of its own
    events = _log_steps(monkeypatch)
    out = tmp_path / "long_tail.json"
    assert main(["bench", "--workload", "long-tail", *SHRUNK, "--out", str(out)]) == 0
    report = json.loads(out.read_text())

    budgets = report["workload"]["budgets"]
    values = budgets["values"]
    assert len(values) == REQUESTS and budgets["total"] == sum(values)
    assert budgets["drawn_quantiles"]["p99"] == sorted(values)[math.ceil(0.99 * REQUESTS) - 1] == max(values)
    assert budgets["drawn_quantiles"]["p50"] == sorted(values)[REQUESTS // 2 - 1]
    assert budgets["distribution_quantiles"]["p99"] == pytest.approx(6 * math.exp(1.2 * 2.3263479), rel=1e-6)

    groups = report["workload"]["groups"]
    assert [g[0] for g in groups] == ["plain"] * 3 and [n for g in groups for n in g[1:]] == CONTENDERS[1:]
    assert all(len(g) <= 4 for g in groups)
    assert len(report["runs"]) == 2 * len(groups)
    for run in report["runs"]:  # no stop token: every contender runs every row to its budget
        assert set(run["tokens"].values()) == {sum(values)}

    # Lockstep: an engine steps only while no other running engine has generated fewer tokens.
    running: dict[int, int] = {}
    for engine, before, after in events:
        assert all(before <= tokens for other, tokens in running.items() if other != id(engine))
        if after is None:
            running.pop(id(engine), None)
        else:
            running[id(engine)] = after

    contenders = report["contenders"]
    assert list(contenders) == CONTENDERS
    for name, r in contenders.items():
        small, rest = r["phases"]["small_batch"], r["phases"]["rest"]
        assert small["share_of_time"] + rest["share_of_time"] == pytest.approx(1.0)
        assert small["share_of_steps"] + rest["share_of_steps"] == pytest.approx(1.0)
        assert small["seconds"] + rest["seconds"] == pytest.approx(r["seconds"])
        runs = sum(name in run["tokens"] for run in report["runs"])  # plain: 2 repeats × 3 groups
        assert runs == (6 if name == "plain" else 2)
        assert small["tokens"] + rest["tokens"] == r["tokens"] == runs * sum(values)
        assert small["steps"] + rest["steps"] == r["steps"] > 0
        assert r["share_of_time_small_batch"] == small["share_of_time"] and 0 < small["share_of_steps"] < 1
        by_batch = r["by_live_batch"]
        assert all(1 <= int(b) <= SLOTS for b in by_batch)
        assert sum(b["steps"] for b in by_batch.values()) == r["steps"]
        small_seconds = sum(b["seconds"] for k, b in by_batch.items() if int(k) <= SMALL_BATCH)
        assert small_seconds == pytest.approx(small["seconds"])
        assert len(r["per_run_tokens_per_s"]) == runs
        if name == "plain":
            assert r["by_drafter"] == {} and r["mean_gamma"] == 0 and "vs_plain" not in r
        else:
            kinds = re.sub(r"_(gamma|trees)\d+$", "", name).split("+")
            assert r["vs_plain"]["repeats"] == 2 and set(r["by_drafter"]) == set(kinds)
            assert 0 <= r["acceptance_rate"] <= 1 and r["mean_gamma"] > 0
    assert contenders["model_gamma2"]["mean_gamma"] == 2
    # Only the tree contender may verify trees (whether auto finds them worth it on tiny models is the cost model's).
    assert all(r["tree_steps"] == 0 for name, r in contenders.items() if name != "model_trees2")
    assert 0 <= contenders["model_trees2"]["tree_steps"] <= contenders["model_trees2"]["steps"]

    printed = capsys.readouterr().out
    assert all(f"| {name} |" in printed for name in CONTENDERS)
    assert "load average" in printed and "torch threads 1" in printed and "lognormal(median 6, σ 1.2)" in printed
    assert report["machine"]["torch_threads"] == 1 and len(report["machine"]["load_average_start"]) == 3


def test_budgets_are_the_lognormal_quantiles_and_p99_is_nearest_rank():
    budgets = long_tail_budgets(64, 96, 1.35, cap=4066)
    assert sorted(budgets) == [round(lognormal_quantile(96, 1.35, (i + 0.5) / 64)) for i in range(64)]
    assert budgets != sorted(budgets)  # shuffled: long requests do not all wait at the end of the queue
    assert lognormal_quantile(96, 1.35, 0.99) >= 2048  # the default workload's p99
    assert percentile(list(range(1, 101)), 0.99) == 99 and percentile(list(range(1, 101)), 0.5) == 50
    assert percentile([7], 0.99) == 7
    assert max(long_tail_budgets(64, 96, 1.35, cap=1000)) == 1000


def test_a_bad_flag_is_one_line_and_exit_code_2(capsys):
    assert main(["bench", "--workload", "long-tail", "--long-tail-requests", "8", "--long-tail-slots", "8"]) == 2
    assert "--long-tail-requests=8 is invalid" in capsys.readouterr().err
    assert main(["bench", "--workload", "long-tail", "--long-tail-trees", "1"]) == 2
    assert "--long-tail-trees=1 is invalid: 0 (no trees) or an int in [2, 16]" in capsys.readouterr().err
