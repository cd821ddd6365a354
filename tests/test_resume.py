"""Kill and resume `specroll train`, through the CLI, on the tiny recipe with the invariant sampler: a run
SIGKILLed at a random step after its first checkpoint and resumed with `--resume` ends as the run never
stopped — the same final policy to the bit, the same reward at every step, every rollout counted once — and
its report goes on from the checkpoint (docs/resume.md).

The uninterrupted run and the one that is killed run side by side (one torch thread each), then the resume:
about two runs' time. The kill step is drawn at random (printed, with its seed, when an assertion fails)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from train_runs import REPO

from specroll.tools import resume_check
from specroll.tools.resume_check import KillAndResume
from specroll.tools.resume_check import step_entries as steps

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


def kill_and_resume(root: Path, cache: Path, backend: str, timeout_s: float = 600) -> KillAndResume:
    env = {"SPECROLL_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    return resume_check.kill_and_resume(root, CONFIG.format(steps=STEPS, backend=BACKENDS[backend]), env, timeout_s)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_demo_cache) -> KillAndResume:
    pytest.importorskip("trl")
    return kill_and_resume(tmp_path_factory.mktemp("resume_local"), tiny_demo_cache, "local")


def check_bars(run: KillAndResume) -> None:
    """The issue's bars (`resume_check.compare`: exit codes, the policy to the bit, rewards, every step and
    rollout once, tokens), each failed one named with the run's story."""
    checks = resume_check.compare(run, PROMPTS_PER_STEP * GENERATIONS)
    failed = {name: found for name, (holds, found) in checks.items() if not holds}
    assert not failed and "rewards identical" in checks, (failed, run.why())
    assert [e["completions/mean_length"] for e in steps(run.whole)] == \
        [e["completions/mean_length"] for e in steps(run.resumed)], run.why()


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


def test_a_run_resumed_from_its_last_checkpoint_takes_no_step(local_run, tiny_demo_cache, tmp_path):
    """Killed while it wrote its report, after its last checkpoint: the resume trains no step more (the
    trainer's loop alone would take one) and writes the uninterrupted run's report again."""
    folder = tmp_path / "finished"
    shutil.copytree(local_run.whole / "trainer", folder / "trainer")
    env = {"SPECROLL_CACHE": str(tiny_demo_cache),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    job, log = resume_check.start("finished", local_run.whole.parent / "run.yaml", folder, env,
                                  "--resume", str(folder))
    assert job.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert f"checkpoint {STEPS} is at or past grpo.steps={STEPS}: no step left" in log.read_text()
    assert [e["step"] for e in steps(folder)] == list(range(1, STEPS + 1)), log.read_text()[-3000:]
    assert [e["reward"] for e in steps(folder)] == [e["reward"] for e in steps(local_run.whole)]
    whole, resumed = resume_check.policy(local_run.whole), resume_check.policy(folder)
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[n], resumed[n]) for n in whole)
    probes = [[json.loads(line)["step"] for line in (f / "probes.jsonl").read_text().splitlines()]
              for f in (local_run.whole, folder)]
    assert probes[0] == probes[1], probes


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
