"""`specroll train` with rollouts on vLLM (`engine.kind: vllm`), as a user runs it: the tiny recipe with heads of 32
(`configs/demo_vllm_tiny.yaml`, the smallest shape vLLM's CPU attention runs), end to end in a subprocess — the
GRPO steps on vLLM rollouts, the learner on signals from the policy's forward, publishes refit into vLLM and
digest-checked, the closing measurement against a plain vLLM engine, the report. Slow (~2 min: two vLLM starts);
and a Ray backend with engine.kind: vllm refused at config load, naming the field (fast)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from train_runs import REPO, run_train

CONFIG = REPO / "configs" / "demo_vllm_tiny.yaml"


@pytest.mark.slow
def test_the_main_job_runs_on_vllm(tmp_path):
    out, cache, logs = tmp_path / "out", tmp_path / "cache", tmp_path / "logs"
    for folder in (out, cache, logs):
        folder.mkdir()
    run = run_train(CONFIG, out, cache, logs, timeout_s=900)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["speedup_vs_plain"] > 0
    assert (out / "policy" / "config.json").is_file()
