"""`specroll train` end to end on the tiny demo recipe (Ray embedded, 2 GRPO steps, ~1 min)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specroll.integrations.report import PLOTS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    pytest.importorskip("trl")
    pytest.importorskip("ray")
    out = tmp_path_factory.mktemp("report")
    env = dict(os.environ, SPECROLL_CACHE=str(tmp_path_factory.mktemp("cache")), RAY_AUTH_MODE="disabled")
    done = subprocess.run(
        [sys.executable, "-m", "specroll.cli", "train", "--config", str(REPO / "configs" / "demo_tiny.yaml"),
         "--out-dir", str(out)],
        cwd=out, env=env, capture_output=True, text=True, timeout=300,
    )
    return done, out


def test_main_job_exits_zero(tiny_run):
    done, _ = tiny_run
    assert done.returncode == 0, done.stderr[-4000:]


def test_main_job_writes_every_report_file(tiny_run):
    _, out = tiny_run
    for name in ("report.html", "metrics.jsonl", "config.yaml", "summary.json", *(f"{s}.png" for s in PLOTS)):
        assert (out / name).is_file(), name
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in steps if "reward" in e] == [1, 2]
    assert all("rollout/tokens_per_s" in e for e in steps if "reward" in e)


def test_report_html_names_every_plot(tiny_run):
    _, out = tiny_run
    page = (out / "report.html").read_text()
    for stem, heading in PLOTS.items():
        assert f'src="{stem}.png"' in page
        assert heading.replace("&", "&amp;") in page


def test_rollout_metrics_reach_tensorboard(tiny_run):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    _, out = tiny_run
    (events,) = (out / "tensorboard").iterdir()
    accumulator = event_accumulator.EventAccumulator(str(events))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    for key in ("rollout/tokens_per_s", "rollout/acceptance_rate", "rollout/mean_accepted_len", "rollout/gamma",
                "drafter/version", "drafter/acceptance_frozen_shadow", "weights/sync_s"):
        assert f"train/{key}" in tags, key
