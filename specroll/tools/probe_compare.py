"""Two runs' served drafters compared paired, probe by probe: is one drafter kind above another while the policy trains?

    specroll train --config configs/demo.yaml                 # report.out_dir: lm/
    specroll train --config configs/demo_eagle.yaml           # report.out_dir: eagle/
    python -m specroll.tools.probe_compare eagle/ lm/

Every probe records the served drafter's expected acceptance per prompt group (`probes.jsonl`:
`served_group_sums`, `group_counts`). With `engine.sampler: invariant` a config's GRPO run is the same
whatever its drafter, so two runs that differ only in the drafter probe the very same positions: their
served drafters compare on them paired by prompt group (`online_drafter.gate.paired`), which removes what
both share (how hard a group's text is) — the s.e. of either curve alone is several times the gap.
Runs whose probes are not the same positions (other prompts, samples or sampler, or a policy that
trained differently) are a `ValueError`: there is nothing to pair.

Prints, per probed policy version, run A's served acceptance, run B's, and A − B ± its paired s.e.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from specroll.online_drafter.gate.paired import GroupScores, PairedGain, paired_gain


@dataclass
class ProbeComparison:
    step: int
    a: float
    b: float
    gain: PairedGain  # a − b on the same positions


def load_probes(path: str | Path) -> list[dict]:
    """A run's probes: its report folder's `probes.jsonl` (or that file's path)."""
    path = Path(path)
    path = path / "probes.jsonl" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"{str(path)!r} is not a report's probes.jsonl: pass a `specroll train` report folder")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare(a: list[dict], b: list[dict]) -> list[ProbeComparison]:
    """A's served drafter minus B's at every step both probed, paired by group on the same positions."""
    by_step = {p["step"]: p for p in b}
    rows = []
    for probe in a:
        other = by_step.get(probe["step"])
        if other is None:
            continue
        for p in (probe, other):
            if p.get("served_group_sums") is None:
                raise ValueError(f"the probe of step {p['step']} has no per-group scores (a report written "
                                 "before they were recorded): rerun it")
        if probe["group_counts"] != other["group_counts"]:
            raise ValueError(f"the runs' probes of step {probe['step']} cover other positions (groups' position "
                             f"counts differ): they are not the same GRPO run (same config and seeds, "
                             f"engine.sampler: invariant), so there is nothing to pair")
        counts = torch.tensor(probe["group_counts"], dtype=torch.float64)
        sa = GroupScores(torch.tensor(probe["served_group_sums"], dtype=torch.float64), counts)
        sb = GroupScores(torch.tensor(other["served_group_sums"], dtype=torch.float64), counts)
        rows.append(ProbeComparison(probe["step"], sa.mean, sb.mean, paired_gain(sa, sb)))
    if not rows:
        raise ValueError("the two runs share no probed step")
    return rows


def table(rows: list[ProbeComparison], name_a: str = "A", name_b: str = "B") -> str:
    lines = [f"| policy step | {name_a} | {name_b} | {name_a} − {name_b} (paired s.e.) |", "|---:|---:|---:|---:|"]
    lines += [f"| {r.step} | {r.a:.3f} | {r.b:.3f} | {100 * r.gain.mean:+.1f} ± {100 * r.gain.se:.1f} points |"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="run A's report folder (or its probes.jsonl)")
    parser.add_argument("b", help="run B's report folder (or its probes.jsonl)")
    args = parser.parse_args(argv)
    print(table(compare(load_probes(args.a), load_probes(args.b)), Path(args.a).name, Path(args.b).name))


if __name__ == "__main__":
    main()
