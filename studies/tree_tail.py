"""Token trees against the best chain where a batch drains to its last rows, and auto-with-trees at full batch.

    python studies/tree_tail.py --models demo --repeats 4          # the bars of issue #38
    python studies/tree_tail.py --models tiny --repeats 2 --rows 4 --new-tokens 24 --quick  # smoke

Two workloads, on the same models and prompts, every contender a fresh engine per repeat, all of a workload's
contenders stepped in lockstep (always the one that has generated the fewest tokens steps next; each timed on its
own steps), so machine noise hits them alike and each ratio is paired within its repeat:

- `tail`: `--rows` requests in `--rows` slots with lognormal budgets (median `--new-tokens`, σ 0.8, a fixed seed),
  T = 1, no stop token: the batch drains from all rows live to one. Per contender, over the steps run at live
  batch ≤ `--small-batch`: tokens per target call (tokens emitted ÷ steps: one target forward each) and tokens/s.
  Contenders: chains at fixed γ ∈ `--chain-gammas`, trees at fixed (γ, w) ∈ `--tree-shapes`, and auto-γ with
  `tree_width="auto"`. Each tree (and auto) is compared with the best chain — the chain with the most tail
  tokens/s over all repeats — paired per repeat (mean and a 95 % t-interval over the repeats); a tree also with
  the chain of its own depth where one ran (what its siblings bought, apart from its depth), and, as a projection
  labelled so, with the best chain *if a step cost what the chain step of the tree's depth cost here* — a target
  forward flat in the tokens per row, and a drafter forward flat in the nodes per level, as a GPU's nearly is at a
  few rows (`flat_x` = tree tokens per call ÷ that chain's seconds per call, ÷ the best chain's tokens/s).
- `full`: `--full-rows` requests in as many slots, equal budgets (the batch stays full): auto-γ with
  `tree_width="auto"` against today's auto-γ chains, tokens/s paired per repeat.

Sampler: `--sampler` (default rejection). Prints the setting, then one table per workload (`--skip-full` /
`--skip-tail`: one of them); `--out` writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field

from specroll.bench.engine_race import paired_ratio

SMALL_BATCH = 4


@dataclass
class Contender:
    name: str
    gamma: int | str
    tree_width: int | str

    @property
    def depth(self) -> int | None:
        """Levels of a fixed tree or chain (None: auto)."""
        return self.gamma if isinstance(self.gamma, int) else None


@dataclass
class Tally:
    """One contender's totals in one repeat: all steps, and those run at live batch ≤ the small-batch bound."""

    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    tail_tokens: int = 0
    tail_seconds: float = 0.0
    tail_steps: int = 0
    tree_steps: int = 0
    by_live: dict[int, list[float]] = field(default_factory=dict)  # live rows → [steps, tokens, seconds]


def budgets(n: int, median: int, cap: int, seed: int = 38) -> list[int]:
    """Lognormal quantiles (i + 0.5) / n, σ 0.8, capped, in a fixed shuffled order."""
    out = []
    for i in range(n):
        z = statistics.NormalDist().inv_cdf((i + 0.5) / n)
        out.append(max(1, min(cap, round(median * math.exp(0.8 * z)))))
    random.Random(seed).shuffle(out)
    return out


def race(engines: dict, prompts: list[list[int]], params, max_new: list[int], small: int) -> dict[str, Tally]:
    """Every engine through one `generate` in lockstep; per step, the live batch it ran at is the previous yield's."""
    running = {name: engine.generate_steps(prompts, params, max_new_tokens=max_new) for name, engine in engines.items()}
    live = dict.fromkeys(engines, min(len(prompts), next(iter(engines.values())).config.max_batch_size))
    tallies = {name: Tally() for name in engines}
    while running:
        name = min(running, key=lambda k: engines[k].stats.generated_tokens)
        stats, tally = engines[name].stats, tallies[name]
        tokens, steps, trees = stats.generated_tokens, stats.steps, stats.tree_steps
        started = time.perf_counter()
        try:
            after = next(running[name])
        except StopIteration:
            after = None
            del running[name]
        spent = time.perf_counter() - started
        emitted, ran = stats.generated_tokens - tokens, stats.steps - steps
        tally.tokens, tally.seconds, tally.steps = tally.tokens + emitted, tally.seconds + spent, tally.steps + ran
        tally.tree_steps += stats.tree_steps - trees
        if ran:
            entry = tally.by_live.setdefault(live[name], [0, 0, 0.0])
            entry[0], entry[1], entry[2] = entry[0] + ran, entry[1] + emitted, entry[2] + spent
            if live[name] <= small:
                tally.tail_tokens += emitted
                tally.tail_seconds += spent
                tally.tail_steps += ran
        if after is not None:
            live[name] = after
    return tallies


def build(models, contender: Contender, slots: int, max_seq: int, args):
    from specroll.rollout import EngineConfig, SpecEngine

    config = EngineConfig(max_batch_size=slots, max_seq_len=max_seq, gamma=contender.gamma,
                          tree_width=contender.tree_width, max_gamma=args.max_gamma, max_tree_width=args.max_width,
                          sampler=args.sampler, cost_model_budget_s=args.calibration_s,
                          calibration_cache=args.calibration_cache)
    return SpecEngine(models.target, models.drafter, config)


def run_workload(models, contenders: list[Contender], rows: int, max_new: list[int], args) -> list[dict[str, Tally]]:
    from specroll.rollout import SamplingParams

    prompts = (models.prompts * (rows // len(models.prompts) + 1))[:rows]
    max_seq = max(map(len, prompts)) + max(max_new)
    params = SamplingParams(max_new_tokens=max(max_new), temperature=1.0)
    repeats = []
    for repeat in range(args.repeats):
        engines = {c.name: build(models, c, rows, max_seq, args) for c in contenders}
        params = SamplingParams(max_new_tokens=max(max_new), temperature=1.0, seed=1000 + repeat)
        repeats.append(race(engines, prompts, params, max_new, args.small_batch))
    return repeats


def summarize(repeats: list[dict[str, Tally]], names: list[str], chains: list[str], tail: bool,
              depths: dict[str, int | None] | None = None) -> dict:
    """Per contender: tokens/s, tokens per call, seconds per call, tree share; each non-chain against the best chain
    (and, given `depths`, against the chain of its depth and the flat-forward projection: module docstring)."""
    def rate(t: Tally) -> float:
        return (t.tail_tokens / t.tail_seconds if t.tail_seconds else 0.0) if tail else t.tokens / t.seconds

    def per_call(t: Tally) -> float:
        return (t.tail_tokens / t.tail_steps if t.tail_steps else 0.0) if tail else t.tokens / max(t.steps, 1)

    def seconds_per_call(t: Tally) -> float:
        return (t.tail_seconds / t.tail_steps if t.tail_steps else 0.0) if tail else t.seconds / max(t.steps, 1)

    out = {}
    for name in names:
        tallies = [r[name] for r in repeats]
        out[name] = {"tokens_per_s": statistics.fmean(rate(t) for t in tallies),
                     "tokens_per_call": statistics.fmean(per_call(t) for t in tallies),
                     "ms_per_call": 1e3 * statistics.fmean(seconds_per_call(t) for t in tallies),
                     "tree_share": statistics.fmean(t.tree_steps / max(t.steps, 1) for t in tallies),
                     "by_live": {str(k): v for k, v in sorted(tallies[0].by_live.items())}}
    if chains:
        best = max(chains, key=lambda c: out[c]["tokens_per_s"])
        for name in names:
            if name in chains:
                continue
            out[name]["vs_best_chain"] = best
            out[name]["tokens_per_s_x"] = paired_ratio([rate(r[name]) for r in repeats],
                                                       [rate(r[best]) for r in repeats])
            out[name]["tokens_per_call_x"] = paired_ratio([per_call(r[name]) for r in repeats],
                                                          [per_call(r[best]) for r in repeats])
            same = next((c for c in chains if depths and depths.get(c) == depths.get(name)), None)
            if same is None:
                continue
            out[name]["same_depth_chain"] = same
            out[name]["tokens_per_call_vs_same_depth_x"] = paired_ratio([per_call(r[name]) for r in repeats],
                                                                        [per_call(r[same]) for r in repeats])
            out[name]["flat_x"] = paired_ratio(
                [per_call(r[name]) / max(seconds_per_call(r[same]), 1e-12) for r in repeats],
                [rate(r[best]) for r in repeats])
    return out


def _fmt(ratio: dict | None) -> str:
    if not ratio:
        return "—"
    interval = "" if math.isnan(ratio["lo"]) else f" [{ratio['lo']:.2f}, {ratio['hi']:.2f}]"
    return f"{ratio['mean']:.2f}×{interval}"


def print_table(title: str, summary: dict) -> None:
    print(f"\n{title}\n{'contender':<22} {'tok/s':>9} {'tok/call':>9} {'ms/call':>8} {'trees':>6}  "
          f"{'× best chain tok/s':<22} {'× best chain tok/call':<22} {'× same-depth tok/call':<22} flat forward ×")
    for name, row in summary.items():
        print(f"{name:<22} {row['tokens_per_s']:9.1f} {row['tokens_per_call']:9.2f} {row['ms_per_call']:8.1f} "
              f"{row['tree_share']:6.0%}  {_fmt(row.get('tokens_per_s_x')):<22} "
              f"{_fmt(row.get('tokens_per_call_x')):<22} {_fmt(row.get('tokens_per_call_vs_same_depth_x')):<22} "
              f"{_fmt(row.get('flat_x'))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="demo", choices=["demo", "demo-bpe", "tiny"])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8, help="tail workload: requests = slots")
    parser.add_argument("--full-rows", type=int, default=32, help="full workload: requests = slots")
    parser.add_argument("--new-tokens", type=int, default=192, help="median completion budget")
    parser.add_argument("--small-batch", type=int, default=SMALL_BATCH)
    parser.add_argument("--chain-gammas", default="2,3,4,6")
    parser.add_argument("--tree-shapes", default="3x2,4x2,3x3,4x4", help="γ x width, comma-separated")
    parser.add_argument("--max-gamma", type=int, default=6)
    parser.add_argument("--max-width", type=int, default=4)
    parser.add_argument("--sampler", default="rejection", choices=["rejection", "invariant"])
    parser.add_argument("--calibration-s", type=float, default=8.0)
    parser.add_argument("--calibration-cache", default=None)
    parser.add_argument("--quick", action="store_true", help="only the first chain and tree shape (smoke runs)")
    parser.add_argument("--skip-full", action="store_true", help="the tail workload only")
    parser.add_argument("--skip-tail", action="store_true", help="the full workload only")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rows < 1 or args.full_rows < 1:
        raise ValueError(f"repeats={args.repeats}, rows={args.rows}, full-rows={args.full_rows}: each must be >= 1")
    if args.skip_full and args.skip_tail:
        raise ValueError("--skip-full and --skip-tail together leave nothing to run: pass at most one")

    from specroll.bench.models import load_bench_models

    models = load_bench_models(args.models, max(args.rows, args.full_rows))
    gammas = [int(g) for g in args.chain_gammas.split(",")]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.tree_shapes.split(",")]
    if args.quick:
        gammas, shapes = gammas[:1], shapes[:1]
    chains = [Contender(f"chain_gamma_{g}", g, 1) for g in gammas]
    trees = [Contender(f"tree_{g}x{w}", g, w) for g, w in shapes]
    auto_tree = Contender("auto_trees", "auto", "auto")
    print(f"tree_tail: {models.description}; sampler {args.sampler}, T = 1, {args.repeats} repeats in lockstep; "
          f"tail: {args.rows} rows, lognormal budgets (median {args.new_tokens}), live batch <= {args.small_batch}; "
          f"full: {args.full_rows} rows x {args.new_tokens} tokens")
    tail_summary = None if args.skip_tail else tail_workload(models, chains, trees, auto_tree, args)
    if args.skip_full:
        return _write(args, tail_summary, None)
    full_contenders = [Contender("auto_chains", "auto", 1), auto_tree]
    full = run_workload(models, full_contenders, args.full_rows, [args.new_tokens] * args.full_rows, args)
    full_summary = summarize(full, [c.name for c in full_contenders], ["auto_chains"], tail=False)
    print_table(f"full batch ({args.full_rows} rows): auto with trees vs today's auto chains", full_summary)
    return _write(args, tail_summary, full_summary)


def tail_workload(models, chains: list[Contender], trees: list[Contender], auto_tree: Contender, args) -> dict:
    """The tail workload's table (module docstring), printed and returned."""
    everyone = [*chains, *trees, auto_tree]
    tail = run_workload(models, everyone, args.rows, budgets(args.rows, args.new_tokens, 4 * args.new_tokens), args)
    summary = summarize(tail, [c.name for c in everyone], [c.name for c in chains], tail=True,
                        depths={c.name: c.depth for c in everyone})
    print_table(f"tail (live batch <= {args.small_batch}): trees and auto vs the best chain", summary)
    return summary


def _write(args, tail: dict | None, full: dict | None) -> int:
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "tail": tail, "full": full}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
