"""Two `specroll train` runs taking turns on one machine, step by step: a paired measurement without drift.

    python -m specroll.tools.interleave configs/demo_cold.yaml cold_plain.yaml --out-dir runs/pair
    python -m specroll.tools.cold_start_compare runs/pair/a runs/pair/b --reference 0.762

Two runs measured one after the other carry the machine's drift between them (measured here: the same plain run
twice, same code and tokens, differed 0.75–1.15× per step). This runs both at once as two processes that hand the
machine to each other: run `a` starts up, then `b`; from then on each does one whole GRPO step — its policy sync,
rollouts, update and the learner round that overlaps the update — and hands over while it waits, idle, for its next
turn (`SpecrollRolloutFunc`'s `between_steps`, right after the step's round is collected). The first to finish
writes its report before the other's last step runs. So step k of `a` and step k of `b` run minutes apart at most
and never beside each other; what is left running beside a turn is the idle run's processes (its Ray cluster's
heartbeats, its waiting actors).

A turn is a file holding whose it is (`Turns`), polled every 20 ms. If either run fails, the other is stopped and
the exit status is the failed one's. Each run's output goes to `<out-dir>/<a|b>.log`, its report to
`<out-dir>/<a|b>/`; the `--out-dir` given to a config replaces its `report.out_dir`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROLES = ("a", "b")
POLL_S = 0.02


class Turns:
    """Whose turn it is, in a file two processes share: `wait()` until it is `me`'s, `hand_over()` to the other."""

    def __init__(self, path: str | Path, me: str):
        if me not in ROLES:
            raise ValueError(f"role {me!r} is invalid: one of {ROLES}")
        self.path = Path(path)
        self.me = me
        self.other = ROLES[1 - ROLES.index(me)]

    @staticmethod
    def give(path: str | Path, role: str) -> None:
        """Make it `role`'s turn (written whole: a reader never sees half a name)."""
        path = Path(path)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(role)
        os.replace(tmp, path)

    def wait(self) -> None:
        while self.path.read_text() != self.me:
            time.sleep(POLL_S)

    def hand_over(self) -> None:
        self.give(self.path, self.other)

    def take_turns(self) -> None:
        """Let the other run go one turn, and come back: the hook between two steps."""
        self.hand_over()
        self.wait()


def run_one(config: str, out_dir: str, turn_file: str, role: str) -> int:
    """One of the pair, in this process: `specroll train` between its turns."""
    from specroll.jobs import train

    turns = Turns(turn_file, role)
    turns.wait()  # start-up (model load, Ray) in turn, too: it is seconds of both cores
    try:
        return train.run(argparse.Namespace(config=config, out_dir=out_dir, resume=None),
                         between_steps=turns.take_turns)
    finally:
        turns.hand_over()


def run_pair(config_a: str, config_b: str, out_dir: str | Path) -> int:
    """Start both runs and wait for them; a failed one stops the other. Returns the first non-zero status, or 0."""
    for config in (config_a, config_b):
        if not Path(config).is_file():
            raise ValueError(f"config {config!r} is not a file: pass two `specroll train` config YAMLs")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    turn_file = out / "turn"
    Turns.give(turn_file, ROLES[0])
    procs = {}
    for role, config in zip(ROLES, (config_a, config_b)):
        with open(out / f"{role}.log", "w") as log:  # the child keeps its own descriptor
            procs[role] = subprocess.Popen(
                [sys.executable, "-m", "specroll.tools.interleave", config, "--role", role,
                 "--turn-file", str(turn_file), "--out-dir", str(out / role)], stdout=log, stderr=subprocess.STDOUT)
        print(f"interleave: run {role} ({config}) pid {procs[role].pid}, log {out / f'{role}.log'}", flush=True)
    status = 0
    while procs:
        for role, proc in list(procs.items()):
            code = proc.poll()
            if code is None:
                continue
            del procs[role]
            print(f"interleave: run {role} exited with {code}", flush=True)
            if code and not status:
                status = code
                for other in procs.values():
                    other.terminate()
        time.sleep(0.5)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config_a", help="run a's config YAML (it takes the first turn)")
    parser.add_argument("config_b", nargs="?", help="run b's config YAML")
    parser.add_argument("--out-dir", default="interleave", help="the pair's folder: a/, b/, a.log, b.log "
                        "(for one run of the pair, --role: its report folder)")
    parser.add_argument("--role", choices=ROLES, default=None, help=argparse.SUPPRESS)  # one run of the pair
    parser.add_argument("--turn-file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role is not None:
        return run_one(args.config_a, args.out_dir, args.turn_file, args.role)
    if args.config_b is None:
        parser.error("two configs are needed: run a's and run b's")
    return run_pair(args.config_a, args.config_b, args.out_dir)


if __name__ == "__main__":
    sys.exit(main())
