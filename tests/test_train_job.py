"""`specroll train` end to end on the tiny demo recipe (Ray embedded, 2 GRPO steps, ~1 min), and what it
listens on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from listening import is_loopback, listening_sockets

from specroll.jobs.report import PLOTS

REPO = Path(__file__).resolve().parents[1]


@dataclass
class TinyRun:
    returncode: int
    stdout: str
    stderr: str
    out: Path
    sockets: set[tuple[str, int]]  # every listening socket its process tree held while it ran


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_demo_cache) -> TinyRun:
    """`specroll train` run as a user runs it: no Ray variables of the test session's (loopback mode, auth)
    reach it, so what it listens on is what the product does. Its sockets are sampled while it runs."""
    pytest.importorskip("trl")
    pytest.importorskip("ray")
    out = tmp_path_factory.mktemp("report")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["SPECROLL_CACHE"] = str(tiny_demo_cache)
    logs = tmp_path_factory.mktemp("logs")
    with open(logs / "stdout", "w+") as stdout, open(logs / "stderr", "w+") as stderr:
        job = subprocess.Popen(
            [sys.executable, "-m", "specroll.cli", "train", "--config", str(REPO / "configs" / "demo_tiny.yaml"),
             "--out-dir", str(out)],
            cwd=out, env=env, stdout=stdout, stderr=stderr, text=True,
        )
        sockets: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 300
        while job.poll() is None and time.monotonic() < deadline:
            sockets |= listening_sockets(job.pid)
            time.sleep(0.5)
        if job.poll() is None:
            job.kill()
        job.wait()
        stdout.seek(0)
        stderr.seek(0)
        return TinyRun(job.returncode, stdout.read(), stderr.read(), out, sockets)


def test_main_job_listens_on_loopback_only(tiny_run):
    assert "embedded Ray cluster" in tiny_run.stdout
    # GCS, raylet, object manager, workers and agents: a handful at least, or the sampling saw nothing.
    assert len(tiny_run.sockets) >= 5, tiny_run.sockets
    exposed = sorted(s for s in tiny_run.sockets if not is_loopback(s[0]))
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_main_job_exits_zero(tiny_run):
    assert tiny_run.returncode == 0, tiny_run.stderr[-4000:]


def test_main_job_writes_every_report_file(tiny_run):
    out = tiny_run.out
    for name in ("report.html", "metrics.jsonl", "config.yaml", "summary.json", *(f"{s}.png" for s in PLOTS)):
        assert (out / name).is_file(), name
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in steps if "reward" in e] == [1, 2]
    assert all("rollout/tokens_per_s" in e for e in steps if "reward" in e)


def test_report_html_names_every_plot(tiny_run):
    out = tiny_run.out
    page = (out / "report.html").read_text()
    for stem, heading in PLOTS.items():
        assert f'src="{stem}.png"' in page
        assert heading.replace("&", "&amp;") in page


def test_rollout_metrics_reach_tensorboard(tiny_run):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    out = tiny_run.out
    (events,) = (out / "tensorboard").iterdir()
    accumulator = event_accumulator.EventAccumulator(str(events))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    steps = {e["step"]: e for e in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in e}
    for key in ("rollout/tokens_per_s", "rollout/acceptance_rate", "rollout/mean_accepted_len", "rollout/gamma",
                "drafter/version", "drafter/acceptance_frozen_shadow", "weights/sync_s"):
        assert f"train/{key}" in tags, key
        for event in accumulator.Scalars(f"train/{key}"):  # the numbers the report keeps, step by step
            assert event.value == pytest.approx(steps[event.step][key], rel=1e-6), (key, event.step)
    for entry in steps.values():
        assert 0 <= entry["rollout/gamma"] <= 2 and 1 <= entry["rollout/mean_accepted_len"] <= 3  # demo_tiny: γ = 2


def test_closing_line_separates_build_time_from_run_time(tiny_run):
    (closing,) = [line for line in tiny_run.stdout.splitlines() if line.startswith("specroll train: done in")]
    assert " run " in closing and "model build" not in closing  # the session's cache holds the build
