"""What `long_tail` prints and writes per contender, from the tallies of its lockstep runs (`grpo_bench.Tally`).

A run is one lockstep group in one repeat; plain decoding is in every group, so each contender's ratio to plain
is paired run by run (`engine_race.paired_ratio`). Each step counts at the live batch it ran at
(`Tally.by_live_rows`); the phases split those at `small_batch`: "small_batch" (live ≤ small_batch, the drained
tail) and "rest". Their seconds add up to the contender's, and their steps too.
"""

from __future__ import annotations

import math

from specroll.rollout.core.stats import DrafterStats

from .engine_race import paired_ratio
from .grpo_bench import LiveBatchTally, Tally


def merge_live_rows(tallies: list[Tally]) -> dict[int, LiveBatchTally]:
    out: dict[int, LiveBatchTally] = {}
    for tally in tallies:
        for rows, b in tally.by_live_rows.items():
            into = out.setdefault(rows, LiveBatchTally())
            for field in ("steps", "seconds", "tokens", "drafted", "accepted", "gamma_sum"):
                setattr(into, field, getattr(into, field) + getattr(b, field))
    return out


def phase(buckets: dict[int, LiveBatchTally], rows: list[int]) -> dict:
    """Totals of the steps at the live batch sizes `rows`."""
    steps = sum(buckets[r].steps for r in rows)
    seconds = sum(buckets[r].seconds for r in rows)
    tokens = sum(buckets[r].tokens for r in rows)
    drafted, accepted = sum(buckets[r].drafted for r in rows), sum(buckets[r].accepted for r in rows)
    return {"steps": steps, "seconds": seconds, "tokens": tokens,
            "tokens_per_s": tokens / seconds if seconds else 0.0,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_gamma": sum(buckets[r].gamma_sum for r in rows) / steps if steps else 0.0}


def phases(buckets: dict[int, LiveBatchTally], small_batch: int) -> dict[str, dict]:
    total_seconds = sum(b.seconds for b in buckets.values())
    total_steps = sum(b.steps for b in buckets.values())
    out = {"small_batch": phase(buckets, [r for r in buckets if r <= small_batch]),
           "rest": phase(buckets, [r for r in buckets if r > small_batch])}
    for p in out.values():
        p["share_of_time"] = p["seconds"] / total_seconds if total_seconds else 0.0
        p["share_of_steps"] = p["steps"] / total_steps if total_steps else 0.0
    return out


def by_drafter(tallies: list[Tally]) -> dict[str, dict]:
    """Each drafter kind's proposals, drafts and kept drafts over the tallies (`DrafterStats`' rates)."""
    shares: dict[str, DrafterStats] = {}
    for tally in tallies:
        for kind, d in tally.by_drafter.items():
            shares[kind] = shares.get(kind, DrafterStats()) + DrafterStats(d["proposals"], d["drafted"], d["accepted"])
    return {kind: share.to_dict() for kind, share in shares.items()}


def summarize(runs: list[dict], small_batch: int) -> dict[str, dict]:
    """Per contender over `runs` ({"tallies": {name: Tally}, ...}, plain in each): its totals, × plain paired per
    run, acceptance, mean γ, per drafter, the two phases (each × plain's same phase over the same runs) and the
    per-live-batch totals."""
    names = list(dict.fromkeys(name for run in runs for name in run["tallies"]))
    out = {}
    for name in names:
        mine = [run["tallies"] for run in runs if name in run["tallies"]]
        tallies, plains = [t[name] for t in mine], [t["plain"] for t in mine]
        tokens, seconds = sum(t.tokens for t in tallies), sum(t.seconds for t in tallies)
        buckets = merge_live_rows(tallies)
        split, plain_split = phases(buckets, small_batch), phases(merge_live_rows(plains), small_batch)
        for key, p in split.items():
            base = plain_split[key]["tokens_per_s"]
            p["vs_plain"] = p["tokens_per_s"] / base if base else math.nan
        everything = phase(buckets, list(buckets))
        entry = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                 "per_run_tokens_per_s": [t.tokens / t.seconds for t in tallies],
                 "steps": sum(t.steps for t in tallies), "tree_steps": sum(t.tree_steps for t in tallies),
                 "acceptance_rate": everything["acceptance_rate"],
                 "mean_gamma": everything["mean_gamma"], "by_drafter": by_drafter(tallies),
                 "share_of_time_small_batch": split["small_batch"]["share_of_time"],
                 "share_of_steps_small_batch": split["small_batch"]["share_of_steps"], "phases": split,
                 "by_live_batch": {str(r): {"steps": b.steps, "seconds": b.seconds, "tokens": b.tokens}
                                   for r, b in sorted(buckets.items())}}
        if name != "plain":
            entry["vs_plain"] = paired_ratio(entry["per_run_tokens_per_s"], [t.tokens / t.seconds for t in plains])
        out[name] = entry
    return out


def _ratio(r: dict | None) -> str:
    if r is None:
        return "1.00×"
    if math.isnan(r["lo"]):
        return f"{r['mean']:.2f}× (1 pair)"
    return f"{r['mean']:.2f}× [{r['lo']:.2f}, {r['hi']:.2f}] ({r['repeats']} pairs)"


def _acceptance(r: dict) -> str:
    if not r["by_drafter"]:
        return "—"
    kinds = r["by_drafter"]
    if len(kinds) == 1:
        return f"{r['acceptance_rate']:.2f}"
    each = ", ".join(f"{kind} {d['acceptance_rate']:.2f}" for kind, d in kinds.items())
    return f"{r['acceptance_rate']:.2f} ({each})"


def print_table(summary: dict[str, dict], small_batch: int) -> None:
    k = small_batch
    print(f"\n| contender | tokens/s | × plain [95% CI] | acceptance | mean γ | tree steps | wall time at live ≤ {k} | "
          f"steps at live ≤ {k} | tokens/s at live ≤ {k} (× plain) | tokens/s at live > {k} (× plain) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in summary.items():
        small, rest = r["phases"]["small_batch"], r["phases"]["rest"]
        trees = f"{100 * r['tree_steps'] / r['steps']:.0f}%" if r["tree_steps"] else "—"
        print(f"| {name} | {r['tokens_per_s']:.0f} | {_ratio(r.get('vs_plain'))} | {_acceptance(r)} | "
              f"{r['mean_gamma']:.2f} | {trees} | {100 * small['share_of_time']:.0f}% | "
              f"{100 * small['share_of_steps']:.0f}% | {_phase_rate(small)} | {_phase_rate(rest)} |")


def _phase_rate(p: dict) -> str:
    return f"{p['tokens_per_s']:.0f} ({p['vs_plain']:.2f}×)" if p["steps"] else "—"
