"""The races behind `specroll bench` (`engine_bench`): contenders timed interleaved on the same prompts,
the batch-size grid and the rollout-shaped workload, and the paired ratio of auto-γ to the best fixed γ.
Each part hands every finished row to `record` as it goes, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Generator
from dataclasses import replace

from specroll.rollout import SamplingParams

from .contenders import Contender, hf_assisted, hf_generate, specroll
from .models import BenchModels

Record = Callable[[list[dict]], None]


MODES = {"greedy": 0.0, "sample": 1.0}
GRID_MIN_PROMPTS = 16  # small batch sizes run several batches of distinct prompts per repeat


def _time(contender: Contender, batches: list[list[list[int]]], budgets: list[int], params: SamplingParams):
    started = time.perf_counter()
    tokens = sum(contender.run(prompts, budgets[: len(prompts)], params) for prompts in batches)
    return tokens, time.perf_counter() - started


def _lockstep(contenders: list[Contender], batches: list[list[list[int]]], budgets: list[int],
              params: SamplingParams) -> dict[str, tuple[int, float]]:
    """Run steppable contenders one engine step at a time, always stepping the one that has generated
    the fewest tokens so far, so they all move through the same work together (greedy runs emit the
    same tokens; sampled runs the same amounts in expectation). Each one's time is the sum of its own
    steps. A slow spell of the machine (seconds long here) then hits every contender alike, instead
    of whichever one happened to run during it — or whichever one was still running at the end."""

    def chain(c: Contender) -> Generator[None, None, int]:
        total = 0
        for prompts in batches:
            total += yield from c.steps(prompts, budgets[: len(prompts)], params)
        return total

    running = {c.name: (c, chain(c)) for c in contenders}
    out = {c.name: (0, 0.0) for c in contenders}
    while running:
        name = min(running, key=lambda k: running[k][0].engine.stats.generated_tokens)
        steps = running[name][1]
        started = time.perf_counter()
        try:
            next(steps)
            tokens = 0
        except StopIteration as done:
            tokens = done.value
            del running[name]
        spent = time.perf_counter() - started
        out[name] = (out[name][0] + tokens, out[name][1] + spent)
    return out


def race(contenders: list[Contender], batches: list[list[list[int]]], budgets: list[int], params: SamplingParams,
         repeats: int) -> dict[str, dict]:
    """Interleaved runs, each contender running every batch in turn (one `generate` call per batch);
    specroll engines run in lockstep with each other (`_lockstep`). tokens/s per contender = all its
    tokens / all its seconds."""
    prompts = batches[0]
    tokens = {c.name: 0 for c in contenders}
    seconds = {c.name: 0.0 for c in contenders}
    per_repeat: dict[str, list[float]] = {c.name: [] for c in contenders}  # tokens/s of each repeat
    gammas: dict[str, list[int]] = {}
    for c in contenders:  # warm-up: first-call costs (allocation, calibration, lazy init) are not timed
        c.run(prompts[:1], [min(4, budgets[0])], params)
    stepped = [c for c in contenders if c.steps is not None]
    for rep in range(repeats):
        order = contenders if rep % 2 == 0 else contenders[::-1]
        # A new seed per repeat: at T = 1 each contender's draws depend on its γ, so one seed would
        # give every repeat the same completions — repeats would average the machine's noise but not
        # the luck of which texts (how long, how easy to draft) a contender happened to sample.
        rep_params = params if params.seed is None else replace(params, seed=params.seed + 1000 * rep)
        for c in stepped:
            c.engine.stats.reset()
        for c in order:
            if c.steps is None:
                n, s = _time(c, batches, budgets, rep_params)
                tokens[c.name] += n
                seconds[c.name] += s
                per_repeat[c.name].append(n / s)
        stepping = [c for c in order if c.steps is not None]
        for name, (n, s) in _lockstep(stepping, batches, budgets, rep_params).items():
            tokens[name] += n
            seconds[name] += s
            per_repeat[name].append(n / s)
        for c in stepped:
            gammas[c.name] = c.engine.stats.gamma_per_step
    out = {}
    for c in contenders:
        entry = {"tokens": tokens[c.name], "seconds": seconds[c.name],
                 "tokens_per_s": tokens[c.name] / seconds[c.name], "per_repeat_tokens_per_s": per_repeat[c.name]}
        if c.name in gammas and c.name.startswith("specroll_auto"):
            entry["mean_gamma"] = statistics.fmean(gammas[c.name]) if gammas[c.name] else 0.0
        out[c.name] = entry
    return out


T95 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23]  # two-sided 95 % t quantiles, df 1..10


def paired_ratio(a: list[float], b: list[float]) -> dict[str, float]:
    """a ÷ b from repeats run side by side (the same repeat shares the machine's state, so the ratio
    per repeat cancels most of its noise): the mean ratio and a 95 % t-interval over the repeats."""
    ratios = [x / y for x, y in zip(a, b)]
    mean = statistics.fmean(ratios)
    if len(ratios) < 2:
        return {"mean": mean, "lo": math.nan, "hi": math.nan, "repeats": len(ratios)}
    half = T95[min(len(ratios) - 2, len(T95) - 1)] * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "repeats": len(ratios)}


def auto_vs_best(results: dict[str, dict], name: str = "specroll_auto") -> dict[str, float] | None:
    """`name` (an auto-γ contender) ÷ the fastest fixed γ > 0 of this setting (by total tokens/s),
    paired per repeat."""
    fixed = {k: v for k, v in results.items() if k.startswith("specroll_gamma_")}
    if name not in results or not fixed:
        return None
    best = max(fixed, key=lambda k: fixed[k]["tokens_per_s"])
    out = paired_ratio(results[name]["per_repeat_tokens_per_s"], fixed[best]["per_repeat_tokens_per_s"])
    return {"best": best, **out}


def auto_policies(args) -> list[str]:
    """The auto-γ policies raced (`--auto-policies`: `EngineConfig.gamma` names)."""
    return args.auto_policies.split(",")


def _auto_contenders(models: BenchModels, args, max_batch: int, max_seq: int) -> list[Contender]:
    return [specroll(models.target, models.drafter, policy, max_batch, max_seq, name=f"specroll_{policy}",
                     sampler=args.sampler) for policy in auto_policies(args)]


def compare_autos(results: dict[str, dict], args) -> dict[str, dict]:
    """Each further auto policy ÷ the best fixed γ and ÷ `auto`, paired per repeat."""
    out = {}
    for policy in auto_policies(args)[1:]:
        name = f"specroll_{policy}"
        if name in results:
            out[policy] = {"vs_best": auto_vs_best(results, name),
                           "vs_auto": paired_ratio(results[name]["per_repeat_tokens_per_s"],
                                                   results["specroll_auto"]["per_repeat_tokens_per_s"])}
    return out


def _print_table(title: str, rows: list[dict], names: list[str], baseline: str) -> None:
    print(f"\n{title}  (tokens/s; ×{baseline} in brackets)")
    print("| setting | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for row in rows:
        base = row["results"].get(baseline, {}).get("tokens_per_s")
        cells = []
        for name in names:
            r = row["results"].get(name)
            if r is None:
                cells.append("—")
                continue
            ratio = f" ({r['tokens_per_s'] / base:.2f}×)" if base else ""
            cells.append(f"{r['tokens_per_s']:.0f}{ratio}")
        print(f"| {row['setting']} | " + " | ".join(cells) + " |")
    for row in rows:
        vs = row.get("auto_vs_best")
        if vs:
            print(f"  {row['setting']}: auto ÷ {vs['best']} = {_interval(vs)}")
        for policy, ratios in row.get("other_autos", {}).items():
            if ratios["vs_best"]:
                print(f"  {row['setting']}: {policy} ÷ {ratios['vs_best']['best']} = {_interval(ratios['vs_best'])}")
            print(f"  {row['setting']}: {policy} ÷ auto = {_interval(ratios['vs_auto'])}")


def _interval(vs: dict) -> str:
    return f"{vs['mean']:.3f}, 95% CI [{vs['lo']:.3f}, {vs['hi']:.3f}] over {vs['repeats']} paired repeats"


def grid(models: BenchModels, args, gammas: list[int], record: Record) -> list[dict]:
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    max_batch, max_seq = max(batch_sizes), max(map(len, models.prompts)) + args.max_new_tokens + 1
    contenders = [] if args.no_hf else [hf_generate(models.target, models.pad_id)]
    if not args.no_hf and 1 in batch_sizes:
        contenders += [hf_assisted(models.target, models.drafter, models.pad_id, k) for k in (None, 2, 4, 8)]
    contenders += [specroll(models.target, None, 0, max_batch, max_seq)]
    contenders += [specroll(models.target, models.drafter, g, max_batch, max_seq, sampler=args.sampler)
                   for g in gammas]
    contenders += _auto_contenders(models, args, max_batch, max_seq)
    rows = []
    for mode in args.modes.split(","):
        for batch in batch_sizes:
            # Sampled runs go to the token budget, as the rollout workload does: with a stop token,
            # which rows end early is the luck of each contender's own draws (its γ decides how it
            # consumes the random stream), and on 16 prompts that luck moved a contender by ±15 %
            # (γ = 4 16 % ahead of both γ = 2 and γ = 8 at b = 16). Greedy runs emit the same tokens
            # in every contender, so they keep the stop token.
            stops = models.stop_token_ids if mode == "greedy" else ()
            params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=MODES[mode],
                                    stop_token_ids=stops, seed=batch)
            # A batch of 1 is one short completion: run GRID_MIN_PROMPTS // batch batches of distinct
            # prompts, so a point is not decided by one prompt's length or one sample's luck.
            count = max(1, GRID_MIN_PROMPTS // batch)
            batches = [models.prompts[i * batch : (i + 1) * batch] for i in range(count)]
            active = [c for c in contenders if c.max_batch is None or batch <= c.max_batch]
            results = race(active, batches, [args.max_new_tokens] * batch, params, args.repeats)
            rows.append({"setting": f"{mode} b={batch}", "mode": mode, "batch": batch, "results": results,
                         "auto_vs_best": auto_vs_best(results), "other_autos": compare_autos(results, args)})
            record(rows)
            print(f"  {mode} b={batch}: " + ", ".join(f"{k}={v['tokens_per_s']:.0f}" for k, v in results.items()),
                  flush=True)
    names = [c.name for c in contenders]
    _print_table("Grid", rows, names, "hf_generate" if not args.no_hf else "specroll_plain")
    return rows


def lognormal_budgets(n: int, cap: int, seed: int) -> list[int]:
    """Long-tailed completion lengths: lognormal with σ = 1 (p90/p50 = e^1.28 ≈ 3.6), capped."""
    rng = random.Random(seed)
    median = max(8, cap // 8)
    return [max(1, min(cap, round(median * math.exp(rng.gauss(0.0, 1.0))))) for _ in range(n)]


def rollout_workload(models: BenchModels, args, gammas: list[int], record: Record) -> list[dict]:
    budgets = lognormal_budgets(args.rollout_requests, args.rollout_cap, seed=0)
    srt = sorted(budgets)
    p50, p90 = srt[len(srt) // 2], srt[int(len(srt) * 0.9)]
    prompts = [models.prompts[i % len(models.prompts)] for i in range(len(budgets))]
    max_seq = max(map(len, prompts)) + args.rollout_cap + 1
    contenders = [specroll(models.target, None, 0, args.rollout_batch, max_seq)]
    contenders += [specroll(models.target, models.drafter, g, args.rollout_batch, max_seq, sampler=args.sampler)
                   for g in gammas]
    contenders += _auto_contenders(models, args, args.rollout_batch, max_seq)
    rows = []
    for mode in args.modes.split(","):
        params = SamplingParams(max_new_tokens=args.rollout_cap, temperature=MODES[mode], seed=1)
        results = race(contenders, [prompts], budgets, params, args.rollout_repeats)
        rows.append({"setting": f"{mode} {len(budgets)} req, p50={p50} p90={p90}, slots={args.rollout_batch}",
                     "mode": mode, "p50": p50, "p90": p90, "results": results, "auto_vs_best": auto_vs_best(results),
                     "other_autos": compare_autos(results, args)})
        record(rows)
    _print_table("Rollout-shaped workload (continuous batching)", rows, [c.name for c in contenders],
                 "specroll_plain")
    return rows


