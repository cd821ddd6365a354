"""`specroll train` run as a user runs it, in a subprocess: for the end-to-end tests of the CLI.

`run_train(config, out, cache, logs, env)` starts it with none of the test session's Ray variables
(loopback mode, auth) so what it does and listens on is what the product does, samples the listening
sockets of its process tree while it runs, and returns a `TrainRun`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from listening import listening_sockets

REPO = Path(__file__).resolve().parents[1]


@dataclass
class TrainRun:
    returncode: int
    stdout: str
    stderr: str
    out: Path
    sockets: set[tuple[str, int]]  # every listening socket its process tree held while it ran


def run_train(config: Path, out: Path, cache: Path, logs: Path, env: dict[str, str] | None = None,
              timeout_s: float = 300) -> TrainRun:
    """`python -m specroll.cli train --config config --out-dir out` with `SPECROLL_CACHE=cache` (and `env`)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    environ.update(SPECROLL_CACHE=str(cache), **(env or {}))
    with open(logs / "stdout", "w+") as stdout, open(logs / "stderr", "w+") as stderr:
        job = subprocess.Popen(
            [sys.executable, "-m", "specroll.cli", "train", "--config", str(config), "--out-dir", str(out)],
            cwd=out, env=environ, stdout=stdout, stderr=stderr, text=True,
        )
        sockets: set[tuple[str, int]] = set()
        deadline = time.monotonic() + timeout_s
        while job.poll() is None and time.monotonic() < deadline:
            sockets |= listening_sockets(job.pid)
            time.sleep(0.5)
        if job.poll() is None:
            job.kill()
        job.wait()
        stdout.seek(0)
        stderr.seek(0)
        return TrainRun(job.returncode, stdout.read(), stderr.read(), out, sockets)
