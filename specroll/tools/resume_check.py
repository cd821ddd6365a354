"""Kill a `specroll train` run with SIGKILL at a random step after its first checkpoint, resume it, and compare it
with the same run never stopped: the final policy to the bit, the reward at every step, every rollout counted
once, the report continuous (docs/resume.md).

    python -m specroll.tools.resume_check --config configs/demo_chars.yaml --every 5 --out /tmp/resume_demo

The config is the user's, with `checkpoint.every` (`--every`), `report.save_policy: true` and the out folders
set; it should use `engine.sampler: invariant` (the demo's), where a seed's rollouts do not depend on the
drafter, so the resumed run's policy can be compared to the bit. The uninterrupted run and the one that is killed
run side by side, then the resume: about two runs' time (one torch thread each is the config's
`torch_threads`). The kill step is drawn at random from `--seed` (default: from the OS), printed, and
written with the comparison to `OUT/resume_check.json`; the exit status is 0 when every check holds.

`tests/test_resume.py` runs the same on the tiny recipe.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml


@dataclass
class KillAndResume:
    whole: Path  # the uninterrupted run's report folder
    resumed: Path  # the killed run's folder, resumed into
    steps: int  # the config's grpo.steps
    killed_after: int  # the checkpoint whose state was on disk when the SIGKILL was sent
    resumed_from: int  # the checkpoint the resume took (killed_after, or one saved while the kill was sent)
    killed_metrics: list[str]  # the killed run's metrics.jsonl as it left it (written at its checkpoints)
    logs: dict[str, str]  # each run's stdout + stderr
    returncodes: dict[str, int]
    seed: int

    def why(self) -> str:
        tails = "\n".join(f"--- {name} ---\n{text[-3000:]}" for name, text in self.logs.items())
        return f"kill seed {self.seed}: killed after checkpoint {self.killed_after}\n{tails}"


def start(name: str, config: Path, out: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen, Path]:
    """`specroll train` as a user runs it (none of the caller's Ray variables), its output in `name`.log."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "OMP_NUM_THREADS": "1", **env}
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{name}.log"
    with open(log, "w") as f:
        job = subprocess.Popen([sys.executable, "-m", "specroll.cli", "train", "--config", str(config), *args],
                               cwd=out, env=env, stdout=f, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # its process group: the kill takes its Ray cluster too
    return job, log


def kill_and_resume(root: Path, config_text: str, env: dict[str, str] | None = None, timeout_s: float = 600,
                    seed: int | None = None) -> KillAndResume:
    """Run `config_text` twice side by side, SIGKILL one at a random step after its first checkpoint, resume it
    into its own folder; every checkpoint step of the config (`checkpoint.every`) may be the one killed after."""
    config = root / "run.yaml"
    config.write_text(config_text)
    parsed = yaml.safe_load(config_text)
    steps, every = int(parsed["grpo"]["steps"]), int(parsed["checkpoint"]["every"])
    if not 1 <= every < steps:
        raise ValueError(f"checkpoint.every={every}: a kill after a checkpoint needs 1 <= every < grpo.steps={steps}")
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    killed_after = random.Random(seed).choice(range(every, steps, every))
    whole, killed = root / "whole", root / "killed"
    env = env or {}
    deadline = time.monotonic() + timeout_s
    jobs = {name: start(name, config, folder, env, "--out-dir", str(folder))
            for name, folder in (("whole", whole), ("killed", killed))}
    marker = killed / "trainer" / f"checkpoint-{killed_after}" / "specroll" / "run.json"
    job = jobs["killed"][0]
    while not marker.is_file() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(random.Random(seed + 1).uniform(0, 0.3))  # somewhere in the next step (or its checkpoint)
    os.killpg(job.pid, signal.SIGKILL)  # the driver and what it started: a lost node, not a polite stop
    returncodes = {"killed": job.wait()}
    killed_metrics = (killed / "metrics.jsonl").read_text().splitlines() if (killed / "metrics.jsonl").is_file() else []
    saved = sorted(int(p.parent.parent.name.removeprefix("checkpoint-"))
                   for p in (killed / "trainer").glob("checkpoint-*/specroll/run.json"))
    jobs["resumed"] = start("resumed", config, killed, env, "--resume", str(killed))
    for name in ("whole", "resumed"):
        job = jobs[name][0]
        try:
            returncodes[name] = job.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            returncodes[name] = job.wait()
    logs = {name: log.read_text() for name, (_, log) in jobs.items()}
    return KillAndResume(whole, killed, steps, killed_after, max(saved, default=-1), killed_metrics, logs,
                         returncodes, seed)


def step_entries(folder: Path) -> list[dict]:
    return [e for e in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()) if "reward" in e]


def policy(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "policy.safetensors"))


def compare(run: KillAndResume, rollouts_per_step: int) -> dict:
    """Every check of the resumed run against the uninterrupted one, by name: (holds, what was found)."""
    checks: dict[str, tuple[bool, object]] = {}
    expected_codes = {"killed": -signal.SIGKILL, "whole": 0, "resumed": 0}
    checks["exit codes"] = (run.returncodes == expected_codes, run.returncodes)
    # resumed_from == steps: the kill landed after the last checkpoint, while the run wrote its report
    checks["killed before its end"] = (1 <= run.killed_after <= run.resumed_from <= run.steps,
                                       {"killed_after": run.killed_after, "resumed_from": run.resumed_from})
    if run.returncodes != expected_codes:
        return checks
    checkpoint = run.resumed / "trainer" / f"checkpoint-{run.resumed_from}"
    checks["resumed from the checkpoint"] = (f"resuming from {checkpoint}" in run.logs["resumed"], str(checkpoint))
    whole, resumed = policy(run.whole), policy(run.resumed)
    same_names = whole.keys() == resumed.keys()
    delta = max((whole[n] - resumed[n]).abs().max().item() for n in whole) if same_names else float("inf")
    checks["final policy bit-identical"] = (same_names and all(torch.equal(whole[n], resumed[n]) for n in whole),
                                            {"tensors": len(whole), "max_abs_delta": delta})
    a, b = step_entries(run.whole), step_entries(run.resumed)
    checks["every step once"] = ([e["step"] for e in a] == [e["step"] for e in b] == list(range(1, run.steps + 1)),
                                 [e["step"] for e in b])
    checks["rewards identical"] = ([e["reward"] for e in a] == [e["reward"] for e in b], [e["reward"] for e in b])
    checks["the policy moved"] = (len({e["reward"] for e in a}) > 1 and any(e["grad_norm"] > 0 for e in a),
                                  "rewards differ across steps and a gradient was nonzero")
    expected = [step * rollouts_per_step for step in range(1, run.steps + 1)]
    counted = [e["rollout/total_rollouts"] for e in b]
    checks["every rollout once"] = ([e["rollout/total_rollouts"] for e in a] == counted == expected, counted[-1:])
    checks["tokens identical"] = ([e["num_tokens"] for e in a] == [e["num_tokens"] for e in b], b[-1]["num_tokens"])
    kept = [json.loads(line) for line in run.killed_metrics]
    entries = [json.loads(line) for line in (run.resumed / "metrics.jsonl").read_text().splitlines()]
    checks["metrics continue the killed run's"] = (len(kept) >= run.killed_after and entries[:len(kept)] == kept,
                                                   {"kept": len(kept), "after": len(entries)})
    probes = [[json.loads(line) for line in (folder / "probes.jsonl").read_text().splitlines()]
              for folder in (run.whole, run.resumed)]
    checks["probe steps identical"] = ([p["step"] for p in probes[0]] == [p["step"] for p in probes[1]],
                                       [p["step"] for p in probes[1]])
    summary = json.loads((run.resumed / "summary.json").read_text())
    checks["report says where it resumed"] = (
        summary.get("resumed") == [{"step": run.resumed_from, "checkpoint": str(checkpoint)}]
        and f"resumed at step {run.resumed_from} from" in (run.resumed / "report.html").read_text(),
        summary.get("resumed"))
    return checks


def probe_table(run: KillAndResume) -> list[dict]:
    """Each probe of both runs: the served and frozen acceptance (the drafter is not compared to the bit: a head
    learner's round after a load is not, docs/resume.md)."""
    rows = []
    for name, folder in (("whole", run.whole), ("resumed", run.resumed)):
        for line in (folder / "probes.jsonl").read_text().splitlines():
            probe = json.loads(line)
            rows.append({"run": name, **{k: v for k, v in probe.items()
                                         if k == "step" or any(w in k for w in ("online", "frozen", "gain"))}})
    return rows


def config_for(path: Path, every: int) -> str:
    config = yaml.safe_load(path.read_text())
    config.setdefault("checkpoint", {})["every"] = every
    config.setdefault("report", {})["save_policy"] = True
    return yaml.safe_dump(config, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, type=Path, help="a run config (engine.sampler: invariant)")
    parser.add_argument("--every", type=int, default=5, help="checkpoint.every for both runs (default 5)")
    parser.add_argument("--out", required=True, type=Path, help="a new folder for the runs and the comparison")
    parser.add_argument("--seed", type=int, default=None, help="the kill step's seed (default: from the OS)")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds for all three runs (default 7200)")
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {str(args.out)!r} is not empty: give a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    text = config_for(args.config, args.every)
    grpo = yaml.safe_load(text)["grpo"]
    started = time.monotonic()
    run = kill_and_resume(args.out, text, timeout_s=args.timeout, seed=args.seed)
    checks = compare(run, int(grpo["prompts_per_step"]) * int(grpo["num_generations"]))
    result = {"config": str(args.config), "seed": run.seed, "killed_after": run.killed_after,
              "resumed_from": run.resumed_from, "wall_s": round(time.monotonic() - started, 1),
              "checks": {name: {"holds": holds, "found": found} for name, (holds, found) in checks.items()},
              "probes": probe_table(run) if all(h for h, _ in checks.values()) else []}
    (args.out / "resume_check.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"killed after checkpoint {run.killed_after} (seed {run.seed}), resumed from {run.resumed_from}, "
          f"{result['wall_s']:.0f} s")
    for name, (holds, found) in checks.items():
        print(f"  {'ok  ' if holds else 'FAIL'} {name}: {found}")
    for row in result["probes"]:
        cells = [f"{k.removeprefix('drafter/probe_')} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                 for k, v in row.items() if k != "run"]
        print(f"  probe {row['run']:>7} " + ", ".join(cells))
    ok = all(holds for holds, _ in checks.values())
    if not ok:
        print(run.why(), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
