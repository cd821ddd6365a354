"""The benchmark harness: contenders raced in lockstep do the same work.

Greedy decoding is deterministic and speculative decoding is lossless, so every contender — HF
`generate`, specroll plain and specroll at fixed γ — must generate exactly the same number of tokens
on the same prompts; a harness that dropped a batch, double-counted a step or lost a generation's
last step would break that.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest

from specroll.bench.contenders import hf_generate, specroll
from specroll.bench.engine_race import auto_vs_best, paired_ratio, race
from specroll.bench.models import load_bench_models
from specroll.rollout import SamplingParams


def test_lockstep_race_counts_the_same_greedy_work_for_every_contender():
    models = load_bench_models("tiny", num_prompts=6)
    batches = [models.prompts[:3], models.prompts[3:6]]
    max_seq = max(map(len, models.prompts)) + 25
    contenders = [hf_generate(models.target, models.pad_id), specroll(models.target, None, 0, 3, max_seq)]
    contenders += [specroll(models.target, models.drafter, g, 3, max_seq) for g in (2, 3)]
    params = SamplingParams(max_new_tokens=24, temperature=0.0, stop_token_ids=models.stop_token_ids)
    results = race(contenders, batches, [24] * 3, params, repeats=2)
    tokens = {name: r["tokens"] for name, r in results.items()}
    assert len(set(tokens.values())) == 1, tokens
    assert all(r["seconds"] > 0 and r["tokens_per_s"] > 0 for r in results.values())
    stepped = contenders[1:]
    assert all(c.engine.stats.generated_tokens == tokens["specroll_plain"] // 2 for c in stepped)
    # Each repeat's rate is recorded, and the repeats add up to the totals.
    for r in results.values():
        assert len(r["per_repeat_tokens_per_s"]) == 2
        assert min(r["per_repeat_tokens_per_s"]) <= r["tokens_per_s"] <= max(r["per_repeat_tokens_per_s"])


def test_paired_ratio_interval_and_auto_vs_best_fixed_gamma():
    # Ratios 1.0, 1.1, 0.9: mean 1.0, sd 0.1, t(2) = 4.30 → half-width 4.30 · 0.1 / √3.
    out = paired_ratio([100.0, 110.0, 90.0], [100.0, 100.0, 100.0])
    assert math.isclose(out["mean"], 1.0)
    assert math.isclose(out["hi"] - out["mean"], 4.30 * 0.1 / math.sqrt(3), rel_tol=1e-6)
    assert out["repeats"] == 3
    assert math.isnan(paired_ratio([1.0], [2.0])["lo"])  # one repeat: no interval
    results = {name: {"tokens_per_s": sum(r) / 2, "per_repeat_tokens_per_s": r} for name, r in [
        ("specroll_plain", [50.0, 50.0]), ("specroll_gamma_2", [80.0, 90.0]),
        ("specroll_gamma_4", [100.0, 96.0]), ("specroll_auto", [99.0, 98.0])]}
    vs = auto_vs_best(results)
    assert vs["best"] == "specroll_gamma_4"  # the fastest fixed γ > 0, never plain
    assert math.isclose(vs["mean"], (0.99 + 98 / 96) / 2)
    assert auto_vs_best({"specroll_plain": results["specroll_plain"]}) is None


def test_bench_writes_each_finished_cell_as_it_goes(tmp_path, monkeypatch):
    from specroll.bench import engine_bench, engine_race

    calls = []

    def race_then_interrupt(contenders, batches, budgets, params, repeats):
        calls.append(len(batches[0]))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user stops the run during its second cell
        return {c.name: {"tokens_per_s": 1.0, "per_repeat_tokens_per_s": [1.0]} for c in contenders}

    monkeypatch.setattr(engine_race, "race", race_then_interrupt)
    parser = argparse.ArgumentParser()
    engine_bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    args = parser.parse_args(["--models", "tiny", "--batch-sizes", "1,4", "--modes", "greedy", "--no-hf",
                              "--rollout-requests", "0", "--out", str(out)])
    with pytest.raises(KeyboardInterrupt):
        engine_bench.run(args)
    report = json.loads(out.read_text())
    assert [row["setting"] for row in report["grid"]] == ["greedy b=1"]  # the finished cell, kept
