"""End to end under `ray job submit` against a local `ray start --head`, started with README's secure
recipe (token auth on, single-node mode so every port is on 127.0.0.1): the head listens on loopback
only, refuses a client without the token, and runs a job whose driver joins it with the token (fast);
the Ray rollout job (`python -m specroll.jobs.ray_job`) and the main job (`specroll train`) are
slow (job drivers and actors: minutes on 2 cores), so marked `slow`. One head serves the module; it runs
with `--block` and is stopped by its process group (never `ray stop`, which would kill every Ray on the
machine). The head's PATH starts with this venv's `bin`, as after `source .venv/bin/activate`, so a
job's `specroll` is this venv's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from listening import is_loopback, listening_sockets

from specroll.jobs.ray_job import make_tiny_models

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
# README's secure recipe for a head on one machine (after `ray get-auth-token --generate`).
ENV = {"RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# `ray job submit` from the user's shell of the recipe: none of this test session's Ray variables but
# RAY_AUTH_MODE=token (the job CLI sends ~/.ray/auth_token only then).
USER_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "RAY_AUTH_MODE": "token"}


JOINING_DRIVER = ("import ray; ray.init(); "
                  "print('JOINED', ray.get_runtime_context().gcs_address, ray.get(ray.remote(lambda: 6 * 7).remote()))")


@dataclass
class RayHead:
    gcs_address: str
    dashboard_url: str
    pid: int
    first_job_log: str = ""  # the job that showed every agent up: a driver joining with the token


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
        except urllib.error.HTTPError:  # it answers (with auth on, even an error is an answer)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.fixture(scope="module")
def ray_head():
    gcs_port, dashboard_port = free_port(), free_port()
    # Ports of its own for every agent: the session's Ray cluster (other test modules) already holds
    # the defaults, and a head whose dashboard agent cannot bind answers "No available agent" forever.
    agent_ports = [f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                   f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]
    # No drain on SIGTERM at teardown (Ray waits up to 30 s for Serve proxies to quiesce; none run here).
    env = {**os.environ, **ENV, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True, capture_output=True)
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={gcs_port}",
         "--num-cpus=2", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard_port}", *agent_ports],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        dashboard_url = f"http://127.0.0.1:{dashboard_port}"
        wait_for_dashboard(dashboard_url)
        ready = RayHead(f"127.0.0.1:{gcs_port}", dashboard_url, head.pid)
        ready.first_job_log = submit(ready, [sys.executable, "-c", JOINING_DRIVER], {}, timeout_s=120)  # every
        yield ready  # agent is up once a job has run
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and f":{gcs_port}" in current.read_text():
            current.unlink()  # a stopped head leaves it; the next ray.init() would hang on it


def submit(head: RayHead, entrypoint: list[str], env_vars: dict[str, str], timeout_s: float) -> str:
    """`ray job submit` and wait for the job to end; returns its log (the CLI tails it) after checking success.

    The head's job agent registers a while after the dashboard answers (longer on a loaded machine):
    a submit refused with "No available agent" is retried for up to two minutes.
    """
    runtime_env = {"env_vars": env_vars}  # the driver inherits the head's environment (auth, loopback)
    deadline = time.monotonic() + 120
    while True:
        job = subprocess.run(
            [RAY, "job", "submit", f"--address={head.dashboard_url}",
             f"--runtime-env-json={json.dumps(runtime_env)}", "--", *entrypoint],
            env=USER_ENV, capture_output=True, text=True, timeout=timeout_s,
        )
        if "No available agent" not in job.stdout + job.stderr or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert job.returncode == 0 and "succeeded" in job.stdout + job.stderr, job.stdout[-4000:] + job.stderr[-3000:]
    return job.stdout


def test_secure_head_listens_on_loopback_only(ray_head):
    sockets = listening_sockets(ray_head.pid)
    assert len(sockets) >= 5, sockets  # GCS, raylet, object manager, dashboard, agents
    assert all(is_loopback(ip) for ip, _ in sockets), sorted(sockets)


def test_secure_head_refuses_a_client_without_the_token(ray_head):
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{ray_head.dashboard_url}/api/jobs/", timeout=10)
    assert refused.value.code in (401, 403)


def test_ray_job_submit_with_token_auth_joins_the_cluster(ray_head):
    assert f"JOINED {ray_head.gcs_address} 42" in ray_head.first_job_log


@pytest.mark.slow
def test_ray_job_submit_runs_rounds_with_online_learning(ray_head, tmp_path):
    make_tiny_models(str(tmp_path / "target"), str(tmp_path / "drafter"))
    config = tmp_path / "ray_job.yaml"
    config.write_text((REPO / "configs" / "ray_local.yaml").read_text().replace(".cache/specroll/ray_local",
                                                                                 str(tmp_path)))
    log = submit(ray_head, [sys.executable, "-m", "specroll.jobs.ray_job", "--config", str(config)], {},
                 timeout_s=300)
    rounds = [json.loads(line) for line in log.splitlines() if line.startswith('{"round"')]
    assert [r["round"] for r in rounds] == [0, 1]
    assert all(r["rollouts"] == 8 for r in rounds)


@pytest.mark.slow
def test_ray_job_submit_runs_specroll_train_on_the_submitted_cluster(ray_head, tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "report"
    log = submit(ray_head, ["specroll", "train", "--config", str(REPO / "configs" / "demo_tiny.yaml"),
                            "--out-dir", str(out)],
                 {"SPECROLL_CACHE": str(tmp_path / "cache")}, timeout_s=600)
    assert f"specroll: joined the Ray cluster at {ray_head.gcs_address}" in log
    assert "embedded Ray cluster" not in log
    for name in ("report.html", "metrics.jsonl", "config.yaml", "summary.json"):
        assert (out / name).is_file(), name
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in steps if "reward" in e] == [1, 2]
