"""Kill and resume `specroll train`, through the CLI, on the tiny recipe with the invariant sampler: a run
SIGKILLed at a random step after its first checkpoint and resumed with `--resume` ends as the run never
stopped — the same final policy to the bit, the same reward at every step, every rollout counted once — and
its report goes on from the checkpoint (docs/resume.md).

The uninterrupted run and the one that is killed run side by side (one torch thread each), then the resume:
about two runs' time. The kill step is drawn at random (printed, with its seed, when an assertion fails)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from train_runs import REPO

STEPS = 4
PROMPTS_PER_STEP, GENERATIONS = 2, 2
CONFIG = """
models: {{source: demo, recipe: tiny}}
task: {{dataset: "resume_task:prompts", reward: "resume_task:reward"}}
grpo: {{steps: {steps}, prompts_per_step: 2, num_generations: 2, max_completion_length: 24, learning_rate: 1.0e-3,
        num_train_prompts: 16}}
backend: {backend}
engine: {{max_batch_size: 8, max_seq_len: 96, gamma: 2, sampler: invariant}}
learner: {{max_steps: 2, batch_size: 4}}
probe: {{prompts: 2, samples: 1, every: 2}}
checkpoint: {{every: 1}}
report: {{out_dir: unused, speed_prompts: 1, speed_repeats: 1, save_policy: true}}
torch_threads: 1
"""
BACKENDS = {
    "local": "{kind: local}",
    "ray": "{kind: ray, topology: {num_workers: 1, worker: {num_cpus: 1}, learner: {num_cpus: 1}}}",
}


@dataclass
class KillAndResume:
    whole: Path  # the uninterrupted run's report folder
    resumed: Path  # the killed run's folder, resumed into
    killed_after: int  # the checkpoint whose state was on disk when the SIGKILL was sent
    resumed_from: int  # the checkpoint the resume took (killed_after, or one saved while the kill was sent)
    killed_metrics: list[str]  # the killed run's metrics.jsonl as it left it (written at its checkpoints)
    logs: dict[str, str]  # each run's stdout + stderr
    returncodes: dict[str, int]
    seed: int

    def why(self) -> str:
        tails = "\n".join(f"--- {name} ---\n{text[-3000:]}" for name, text in self.logs.items())
        return f"kill seed {self.seed}: killed after checkpoint {self.killed_after}\n{tails}"


def start(name: str, config: Path, out: Path, cache: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """`specroll train` as a user runs it (none of the test session's Ray variables), tests/ importable; its
    output in `name`.log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(SPECROLL_CACHE=str(cache), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")]))
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{name}.log"
    with open(log, "w") as f:
        job = subprocess.Popen([sys.executable, "-m", "specroll.cli", "train", "--config", str(config), *args],
                               cwd=out, env=env, stdout=f, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # its process group: the kill takes its Ray cluster too
    return job, log


def kill_and_resume(root: Path, cache: Path, backend: str, timeout_s: float = 600) -> KillAndResume:
    config = root / "run.yaml"
    config.write_text(CONFIG.format(steps=STEPS, backend=BACKENDS[backend]))
    seed = int.from_bytes(os.urandom(4), "little")
    killed_after = random.Random(seed).randint(1, STEPS - 1)
    whole, killed = root / "whole", root / "killed"
    deadline = time.monotonic() + timeout_s
    jobs = {name: start(name, config, folder, cache, "--out-dir", str(folder))
            for name, folder in (("whole", whole), ("killed", killed))}
    marker = killed / "trainer" / f"checkpoint-{killed_after}" / "specroll" / "run.json"
    job = jobs["killed"][0]
    while not marker.is_file() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(random.Random(seed + 1).uniform(0, 0.3))  # somewhere in the next step (or its checkpoint)
    os.killpg(job.pid, signal.SIGKILL)  # the driver and what it started: a lost node, not a polite stop
    returncodes = {"killed": job.wait()}
    killed_metrics = (killed / "metrics.jsonl").read_text().splitlines()
    saved = sorted(int(p.parent.parent.name.removeprefix("checkpoint-"))
                   for p in (killed / "trainer").glob("checkpoint-*/specroll/run.json"))
    jobs["resumed"] = start("resumed", config, killed, cache, "--resume", str(killed))
    for name in ("whole", "resumed"):
        job = jobs[name][0]
        try:
            returncodes[name] = job.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            returncodes[name] = job.wait()
    logs = {name: log.read_text() for name, (_, log) in jobs.items()}
    return KillAndResume(whole, killed, killed_after, max(saved, default=-1), killed_metrics, logs, returncodes,
                         seed)


def steps(folder: Path) -> list[dict]:
    return [e for e in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if "reward" in e]


def policy(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "policy.safetensors"))


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_demo_cache) -> KillAndResume:
    pytest.importorskip("trl")
    return kill_and_resume(tmp_path_factory.mktemp("resume_local"), tiny_demo_cache, "local")


def check_bars(run: KillAndResume) -> None:
    """The issue's bars, each asserted with the run's story when it fails."""
    why = run.why()
    assert run.returncodes == {"killed": -signal.SIGKILL, "whole": 0, "resumed": 0}, why
    assert 1 <= run.killed_after <= run.resumed_from < STEPS, why  # it was killed before its end
    assert f"resuming from {run.resumed / 'trainer' / f'checkpoint-{run.resumed_from}'}" in run.logs["resumed"], why
    # the final policy, to the bit, and it trained (a policy that never moved would compare equal anyway)
    whole, resumed = policy(run.whole), policy(run.resumed)
    assert whole.keys() == resumed.keys(), why
    deltas = {name: (whole[name] - resumed[name]).abs().max().item() for name in whole}
    assert max(deltas.values()) == 0.0, (deltas, why)
    assert all(torch.equal(whole[name], resumed[name]) for name in whole), why
    # the per-step rewards, every step once, and every rollout once: the backend's count and TRL's token count
    a, b = steps(run.whole), steps(run.resumed)
    assert [e["step"] for e in a] == [e["step"] for e in b] == list(range(1, STEPS + 1)), why
    assert [e["reward"] for e in a] == [e["reward"] for e in b], why
    assert len({e["reward"] for e in a}) > 1 and any(e["grad_norm"] > 0 for e in a), why  # the policy moved
    expected = [step * PROMPTS_PER_STEP * GENERATIONS for step in range(1, STEPS + 1)]
    assert [e["rollout/total_rollouts"] for e in a] == [e["rollout/total_rollouts"] for e in b] == expected, why
    assert [e["num_tokens"] for e in a] == [e["num_tokens"] for e in b], why
    assert [e["completions/mean_length"] for e in a] == [e["completions/mean_length"] for e in b], why


def check_report(run: KillAndResume) -> None:
    """The resumed run's report goes on from the checkpoint: the probes before it, the events, the resume."""
    why = run.why()
    kept = [json.loads(line) for line in run.killed_metrics]  # TRL's checkpoint keeps them with sorted keys
    entries = [json.loads(line) for line in (run.resumed / "metrics.jsonl").read_text().splitlines()]
    assert len(kept) >= run.killed_after and entries[:len(kept)] == kept, why
    probes = [[json.loads(line)["step"] for line in (folder / "probes.jsonl").read_text().splitlines()]
              for folder in (run.whole, run.resumed)]
    assert probes[0] == probes[1] and probes[0][0] == 0, (probes, why)  # the step-0 probe is the killed run's
    summary = json.loads((run.resumed / "summary.json").read_text())
    assert summary["resumed"] == [{"step": run.resumed_from,
                                   "checkpoint": str(run.resumed / "trainer" / f"checkpoint-{run.resumed_from}")}]
    assert summary["steps"] == STEPS, why
    assert f"resumed at step {run.resumed_from} from" in (run.resumed / "report.html").read_text(), why
    whole = json.loads((run.whole / "summary.json").read_text())
    assert summary["headline"]["learner_rounds"] == whole["headline"]["learner_rounds"] == STEPS, why
    assert summary["first_step"]["reward"] == whole["first_step"]["reward"], why


def test_a_killed_run_resumed_ends_as_the_uninterrupted_one(local_run):
    check_bars(local_run)


def test_a_resumed_run_continues_the_report(local_run):
    check_report(local_run)


def test_a_checkpoint_of_other_models_is_refused_in_one_line(local_run, tmp_path, capsys):
    from specroll.cli import main

    config = tmp_path / "other.yaml"
    config.write_text(CONFIG.format(steps=STEPS, backend=BACKENDS["local"]).replace("recipe: tiny", "recipe: full"))
    assert main(["train", "--config", str(config), "--resume", str(local_run.resumed)]) == 2  # before any model
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "does not match the config" in line and "models.recipe: checkpoint 'tiny', config 'full'" in line, line


@pytest.mark.slow
def test_a_killed_run_resumed_on_ray_ends_as_the_uninterrupted_one(tmp_path, tiny_demo_cache):
    pytest.importorskip("ray")
    run = kill_and_resume(tmp_path, tiny_demo_cache, "ray")
    check_bars(run)
    check_report(run)
