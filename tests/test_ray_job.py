"""End to end: `ray job submit ... -- python -m specroll.integrations.ray_job` against a local
`ray start --head` on 127.0.0.1. Slow (a head node with a dashboard, then a job driver and actors:
about a minute on 2 cores), so marked `slow`. The head runs with `--block` and is stopped by its PID
(never `ray stop`, which would kill every Ray on the machine)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specroll.integrations.config import ModelPaths
from specroll.integrations.ray_job import make_tiny_models

RAY = str(Path(sys.executable).with_name("ray"))
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ray_local.yaml"
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_dashboard(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.mark.slow
def test_ray_job_submit_runs_rounds_with_online_learning(tmp_path):
    make_tiny_models(ModelPaths(str(tmp_path / "target"), str(tmp_path / "drafter")))
    config = tmp_path / "ray_job.yaml"
    config.write_text(CONFIG.read_text().replace(".cache/specroll/ray_local", str(tmp_path)))
    gcs_port, dashboard_port = free_port(), free_port()
    env = {**os.environ, **ENV}
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={gcs_port}",
         "--num-cpus=2", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard_port}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    address = f"http://127.0.0.1:{dashboard_port}"
    try:
        wait_for_dashboard(address)
        job = subprocess.run(
            [RAY, "job", "submit", f"--address={address}", f"--runtime-env-json={json.dumps({'env_vars': ENV})}",
             "--", sys.executable, "-m", "specroll.integrations.ray_job", "--config", str(config)],
            env=env, capture_output=True, text=True, timeout=300,
        )
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        rounds = [json.loads(line) for line in job.stdout.splitlines() if line.startswith('{"round"')]
        assert [r["round"] for r in rounds] == [0, 1]
        assert all(r["rollouts"] == 8 for r in rounds)
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and f":{gcs_port}" in current.read_text():
            current.unlink()  # a stopped head leaves it; the next ray.init() would hang on it
