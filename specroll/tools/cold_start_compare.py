"""A cold start measured against its bars: does a drafter from nothing cost nothing, and when does it pay?

    sed -e 's/^  gamma: auto/  gamma: 0/' -e 's/^  speculation: when_learned.*/  speculation: always/' \\
        configs/demo_cold.yaml > cold_plain.yaml          # the same run, plain decoding (its learner still trains)
    python -m specroll.tools.interleave configs/demo_cold.yaml cold_plain.yaml --out-dir pair/
    python -m specroll.tools.cold_start_compare pair/a pair/b --reference 0.762

With `engine.sampler: invariant` the two runs sample the same tokens at every step (checked: the steps' token
counts must be equal), so the ratio of rollout tokens/s over a window of steps is the ratio of the rollout
seconds the two spent on the very same completions. Prints, for every window of `--window` consecutive GRPO steps
(sliding), the cold start's rollout tokens/s, the plain run's and their ratio; the first step whose rollouts were
speculated (`drafter/speculating`); and the cold start's served probe acceptance at each probe, with its last as a
fraction of `--reference` (a distilled head's last probe in the standard main job: 0.762 for the subword
world's EAGLE-3 head distilled six minutes over 2,048 ids, docs/feature_drafters.md; 0.882 for the character
world's `configs/demo_eagle.yaml`).

Two report folders from runs made one after the other compare too, but their steps carry the machine's drift
between the runs (measured here: the same plain run twice differed 0.75–1.15× per step); `tools.interleave`
runs the pair taking turns step by step.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from .probe_compare import load_probes


@dataclass
class Window:
    first: int  # GRPO steps first .. last (1-based, inclusive)
    last: int
    cold: float  # rollout tokens/s
    plain: float

    @property
    def ratio(self) -> float:
        return self.cold / self.plain


def load_steps(path: str | Path) -> list[dict]:
    """A run's per-step metrics (`metrics.jsonl` of its report folder), one per GRPO step with rollouts, in order."""
    path = Path(path)
    path = path / "metrics.jsonl" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"{str(path)!r} is not a report's metrics.jsonl: pass a `specroll train` report folder")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("rollout/seconds") is not None]


def windows(cold: list[dict], plain: list[dict], width: int) -> list[Window]:
    """Sliding windows of `width` steps over two runs of the same GRPO run (same tokens at every step)."""
    if width < 1:
        raise ValueError(f"window must be >= 1 step, got {width}")
    if len(cold) != len(plain):
        raise ValueError(f"the runs have {len(cold)} and {len(plain)} steps with rollouts: not the same GRPO run")
    for a, b in zip(cold, plain):
        if a["rollout/tokens"] != b["rollout/tokens"]:
            raise ValueError(f"step {a['step']}: {a['rollout/tokens']:.0f} vs {b['rollout/tokens']:.0f} rollout "
                             "tokens — not the same GRPO run (same config and seeds, engine.sampler: invariant)")
    out = []
    for start in range(max(len(cold) - width + 1, 0)):
        span = slice(start, start + width)
        tokens = sum(r["rollout/tokens"] for r in cold[span])
        out.append(Window(cold[start]["step"], cold[start + width - 1]["step"],
                          tokens / sum(r["rollout/seconds"] for r in cold[span]),
                          tokens / sum(r["rollout/seconds"] for r in plain[span])))
    return out


def first_speculated(steps: list[dict]) -> int | None:
    """The first GRPO step whose rollouts speculated (drafted at least once), or None."""
    return next((r["step"] for r in steps if r.get("drafter/draft_forwards", 0) > 0), None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cold", help="the cold start's report folder")
    parser.add_argument("plain", help="the same run's report folder with engine.gamma: 0")
    parser.add_argument("--window", type=int, default=5, help="GRPO steps per window")
    parser.add_argument("--reference", type=float, default=None,
                        help="the distilled head's probe acceptance at the last probe of the standard main job")
    args = parser.parse_args(argv)
    cold, plain = load_steps(args.cold), load_steps(args.plain)
    rows = windows(cold, plain, args.window)
    print("| steps | cold start tok/s | plain tok/s | × plain |\n|---|---:|---:|---:|")
    for w in rows:
        print(f"| {w.first}–{w.last} | {w.cold:.0f} | {w.plain:.0f} | {w.ratio:.3f}× |")
    worst = min(rows, key=lambda w: w.ratio)
    print(f"\nworst window: steps {worst.first}–{worst.last} at {worst.ratio:.3f}× plain")
    total = sum(r["rollout/tokens"] for r in cold)
    print(f"whole run: {total / sum(r['rollout/seconds'] for r in cold):.0f} vs "
          f"{total / sum(r['rollout/seconds'] for r in plain):.0f} tok/s")
    print(f"first speculated step: {first_speculated(cold)}; steps speculating: "
          f"{[r['step'] for r in cold if r.get('drafter/speculating')]}")
    probes = load_probes(args.cold)
    print("probes (served / frozen): " + ", ".join(
        f"step {p['step']}: {p['drafter/probe_online']:.3f} / {p['drafter/probe_frozen']:.3f}" for p in probes))
    if args.reference and probes:
        last = probes[-1]["drafter/probe_online"]
        print(f"last probe {last:.3f} = {last / args.reference:.3f}× the reference {args.reference:.3f}")


if __name__ == "__main__":
    main()
