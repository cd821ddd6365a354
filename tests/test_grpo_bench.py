"""The GRPO-shaped workload of `specroll bench` on tiny models: every contender does its work, reports
its drafters' shares and a ceiling, and the ratios are paired per repeat."""

from __future__ import annotations

import argparse

from specroll.bench.grpo_bench import grpo_workload
from specroll.bench.models import load_bench_models


def test_grpo_workload_reports_every_contender(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SPECROLL_CACHE", str(tmp_path))  # a calibration of its own
    models = load_bench_models("tiny", num_prompts=4)
    args = argparse.Namespace(grpo_prompts=2, grpo_samples=4, grpo_slots=4, grpo_epochs=2, grpo_repeats=2,
                              grpo_max_new_tokens=8, grpo_gamma="2", sampler="rejection",
                              grpo_contenders="plain,model,suffix,suffix+model")
    result = grpo_workload(models, args)["contenders"]
    assert set(result) == {"plain", "model", "suffix", "suffix+model"}
    for name, r in result.items():
        assert r["tokens"] > 0 and r["tokens_per_s"] > 0 and r["ceiling_tokens_per_s"] > 0
        assert len(r["per_repeat_tokens_per_s"]) == 2
        assert set(r["by_drafter"]) <= set(name.split("+")) - {"plain"}
    assert set(result["suffix+model"]["by_drafter"]) == {"suffix", "model"}
    assert result["model"]["vs_plain"]["repeats"] == 2 and "vs_model" in result["suffix"]
    assert "| suffix+model |" in capsys.readouterr().out
