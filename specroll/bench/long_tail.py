"""`specroll bench --workload long-tail`: rollouts whose completion budgets reach thousands of tokens.

An RL rollout phase is over when its longest completion is: the batch drains from all slots busy to a few long
rows, and those few rows take much of the wall time. That tail is where speculation pays most (a target forward
costs about the same for 1 or 5 tokens per row at a small live batch), so this workload measures it:

- `--long-tail-requests` requests (P prompts × G samples, siblings consecutive as TRL sends them) through
  `--long-tail-slots` slots with continuous batching, `max_seq_len` `--long-tail-max-seq-len`, at T = 1 with no
  stop token: every row runs to its own budget, so every contender does the same work and the tail is real;
- the budgets are a lognormal's quantiles (i + 0.5) / n for i < n (median `--long-tail-median`, σ
  `--long-tail-sigma`, capped at what `max_seq_len` leaves), in an order shuffled by a fixed seed: the drawn tail
  is the distribution's rather than the luck of n draws. The default's p99 is 2,220 tokens;
- contenders: plain decoding (γ = 0), each drafter kind at `gamma: "auto"` (model, suffix, suffix+model,
  layer_skip, and the EAGLE / Medusa heads where trained ones are cached beside the demo models —
  `python -m specroll.demo.heads` trains them; `--models tiny` runs fresh ones), and the model
  drafter at a fixed γ for reference, and with `--long-tail-trees W` the model drafter with `tree_width: "auto"` up
  to W nodes a level (token trees where the cost model finds they pay: the drained tail). They run in lockstep
  (`grpo_bench.race_repeat`: always the one that has generated the fewest tokens steps next, each timed on its own
  steps), fresh engines every repeat, in lockstep groups sized to the memory available (an engine's KV cache is
  4.3 GB for the demo target at the defaults: `long_tail_contenders`), plain in every group, so each ratio to
  plain is paired within its group and repeat.

Per contender (`long_tail_report`): tokens/s, × plain (paired, with a 95 % interval where there are ≥ 2 pairs),
acceptance and mean γ, and by the live batch each step ran at (the rows the engine stepped, as the previous
step's yield reported), the share of wall time and of steps at live batch ≤ `--long-tail-small-batch` and the
tokens/s within that phase and within the rest, each × plain's in the same phase. The JSON (`--out`, written
after every group) keeps the per-live-batch totals too.

The demo models were trained to fewer positions (256; the subword world's, 2048); this workload raises their
configs' `max_position_embeddings` to `max_seq_len`, and positions past the trained length are RoPE-extrapolated.
What it measures is time: past that length the acceptance is the drafter's agreement with the target on whatever
the target then writes. This module imports nothing heavy before `run`.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .long_tail_contenders import (
    ENGINE_OVERHEAD,
    KINDS,
    MEMORY_SHARE,
    Contender,
    Engines,
    collecting_engines,
    extend_positions,
    group_size,
    kv_cache_bytes,
    lockstep_groups,
    memory_available,
    trained_heads,
)

if TYPE_CHECKING:
    from .models import BenchModels

QUANTILES = (0.5, 0.9, 0.99)
BUDGET_SEED = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload's own flags; it also reads `--models`, `--threads`, `--sampler` and `--out` (`engine_bench`)."""
    group = parser.add_argument_group("--workload long-tail")
    group.add_argument("--long-tail-requests", type=int, default=64, help="requests (more than the slots)")
    group.add_argument("--long-tail-samples", type=int, default=8, help="G samples per prompt (siblings)")
    group.add_argument("--long-tail-slots", type=int, default=32, help="batch slots (EngineConfig.max_batch_size)")
    group.add_argument("--long-tail-max-seq-len", type=int, default=4096, help="EngineConfig.max_seq_len")
    group.add_argument("--long-tail-median", type=float, default=96.0, help="the budgets' lognormal median")
    group.add_argument("--long-tail-sigma", type=float, default=1.35, help="the budgets' lognormal σ")
    group.add_argument("--long-tail-temperature", type=float, default=1.0)
    group.add_argument("--long-tail-repeats", type=int, default=1, help="≥ 2 gives paired intervals")
    group.add_argument("--long-tail-small-batch", type=int, default=4,
                       help="live batch at or below which a step counts to the drained phase")
    group.add_argument("--long-tail-contenders", default="model,suffix,suffix+model,layer_skip,eagle,medusa",
                       help="drafter kinds at gamma auto (plain always runs): from " + ", ".join(list(KINDS)[1:]))
    group.add_argument("--long-tail-fixed-gamma", type=int, default=4,
                       help="the model drafter at this fixed γ, for reference (0: none)")
    group.add_argument("--long-tail-trees", type=int, default=0,
                       help="also the model drafter with tree_width auto up to this many nodes a level (0: none)")
    group.add_argument("--long-tail-layer-skip", type=int, default=0,
                       help="layers of the layer-skip drafter (0: EngineConfig's default, half the target's)")
    group.add_argument("--long-tail-group", type=int, default=0,
                       help="speculative contenders per lockstep group, plain joins each (0: as many as fit in "
                            f"{MEMORY_SHARE:.0%}% of the memory available)")


def _invalid(message: str) -> Exception:
    """A bad flag: `specroll` prints it as one line, exit code 2 (`ConfigError` is a `ValueError`)."""
    from specroll.integrations.yaml_config import ConfigError

    return ConfigError(message)


@dataclass(frozen=True)
class Settings:
    """The workload's flags, checked by `settings_from`."""

    requests: int
    samples: int
    slots: int
    max_seq_len: int
    median: float
    sigma: float
    temperature: float
    repeats: int
    small_batch: int
    kinds: tuple[str, ...]
    fixed_gamma: int
    layer_skip: int | None
    group: int
    trees: int = 0

    @property
    def contenders(self) -> list[Contender]:
        out = [Contender("plain", "plain", 0)] + [Contender(kind, kind, "auto") for kind in self.kinds]
        if self.fixed_gamma:
            out.append(Contender(f"model_gamma{self.fixed_gamma}", "model", self.fixed_gamma))
        if self.trees:
            out.append(Contender(f"model_trees{self.trees}", "model", "auto", "auto", self.trees))
        return out


def settings_from(args: argparse.Namespace) -> Settings:
    ints = {name: getattr(args, f"long_tail_{name}") for name in
            ("requests", "samples", "slots", "max_seq_len", "repeats", "small_batch")}
    bad = [f"--long-tail-{k.replace('_', '-')}={v}" for k, v in ints.items() if not isinstance(v, int) or v < 1]
    if bad:
        raise _invalid(f"{', '.join(bad)} is invalid: an int >= 1")
    if ints["requests"] <= ints["slots"]:
        raise _invalid(f"--long-tail-requests={ints['requests']} is invalid: more than --long-tail-slots "
                       f"({ints['slots']}), so finished slots are refilled (continuous batching)")
    kinds = tuple(k for k in args.long_tail_contenders.split(",") if k)
    unknown = [k for k in kinds if k not in KINDS or k == "plain"]
    if unknown or len(set(kinds)) != len(kinds):
        raise _invalid(f"--long-tail-contenders={args.long_tail_contenders!r} is invalid: distinct kinds from "
                       f"{', '.join(list(KINDS)[1:])}")
    if not (args.long_tail_median >= 1 and args.long_tail_sigma > 0 and args.long_tail_temperature >= 0):
        raise _invalid(f"--long-tail-median={args.long_tail_median} / --long-tail-sigma={args.long_tail_sigma} / "
                       f"--long-tail-temperature={args.long_tail_temperature} are invalid: >= 1 / > 0 / >= 0")
    for flag in ("fixed_gamma", "layer_skip", "group"):
        if getattr(args, f"long_tail_{flag}") < 0:
            raise _invalid(f"--long-tail-{flag.replace('_', '-')}={getattr(args, f'long_tail_{flag}')} is invalid: "
                           "an int >= 0")
    from specroll.rollout.config import MAX_TREE_WIDTH

    if args.long_tail_trees != 0 and not 2 <= args.long_tail_trees <= MAX_TREE_WIDTH:
        raise _invalid(f"--long-tail-trees={args.long_tail_trees} is invalid: 0 (no trees) or an int in "
                       f"[2, {MAX_TREE_WIDTH}] (nodes a tree level may have)")
    return Settings(**ints, median=args.long_tail_median, sigma=args.long_tail_sigma,
                    temperature=args.long_tail_temperature, kinds=kinds, fixed_gamma=args.long_tail_fixed_gamma,
                    layer_skip=args.long_tail_layer_skip or None, group=args.long_tail_group,
                    trees=args.long_tail_trees)


def lognormal_quantile(median: float, sigma: float, q: float) -> float:
    """The q-quantile of the lognormal with this median and σ (of its log)."""
    return median * math.exp(sigma * statistics.NormalDist().inv_cdf(q))


def long_tail_budgets(n: int, median: float, sigma: float, cap: int, seed: int = BUDGET_SEED) -> list[int]:
    """n token budgets at the lognormal's quantiles (i + 0.5) / n, each in [1, cap], in an order shuffled by `seed`."""
    budgets = [min(cap, max(1, round(lognormal_quantile(median, sigma, (i + 0.5) / n)))) for i in range(n)]
    random.Random(seed).shuffle(budgets)
    return budgets


def percentile(values: list[int], q: float) -> int:
    """The nearest-rank q-quantile: the smallest value with at least q of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Workload:
    """The models (positions extended), the requests and their budgets."""

    models: BenchModels
    prompts: list[list[int]]
    budgets: list[int]
    cap: int  # the largest budget max_seq_len leaves after the longest prompt
    trained_positions: int  # the target's max_position_embeddings before `extend_positions`


def load_workload(args: argparse.Namespace, s: Settings) -> Workload:
    """`--models`' models and prompts (P prompts × G samples), and the budgets."""
    from .models import load_bench_models

    num_prompts = math.ceil(s.requests / s.samples)
    models = load_bench_models(args.models, num_prompts=num_prompts)
    trained = extend_positions(models, s.max_seq_len)
    prompts = [p for p in models.prompts[:num_prompts] for _ in range(s.samples)][: s.requests]
    cap = s.max_seq_len - max(map(len, prompts))
    if cap < 1:
        raise _invalid(f"--long-tail-max-seq-len={s.max_seq_len} is invalid: the prompts take up to "
                       f"{max(map(len, prompts))} tokens")
    return Workload(models, prompts, long_tail_budgets(s.requests, s.median, s.sigma, cap), cap, trained)


def budget_stats(s: Settings, w: Workload) -> dict:
    """The budgets' distribution, its p50 / p90 / p99 and those of the budgets drawn (nearest rank)."""
    names = [f"p{round(100 * q)}" for q in QUANTILES]
    return {"distribution": "lognormal", "median": s.median, "sigma": s.sigma, "cap": w.cap,
            "quantiles": "(i + 0.5) / n",
            "distribution_quantiles": {n: lognormal_quantile(s.median, s.sigma, q) for n, q in zip(names, QUANTILES)},
            "drawn_quantiles": {n: percentile(w.budgets, q) for n, q in zip(names, QUANTILES)},
            "max": max(w.budgets), "total": sum(w.budgets), "values": w.budgets}


def describe(s: Settings, w: Workload, budgets: dict, groups: list[list[Contender]], machine: dict,
             sampler: str) -> str:
    """The header line: the setting, the budgets' distribution and quantiles, the groups and the machine."""
    load = machine["load_average_start"]
    extrapolated = (f"positions past {w.trained_positions} (the target's trained length) are RoPE-extrapolated: "
                    "acceptance there is the drafter's agreement with the target on whatever it then writes; "
                    if s.max_seq_len > w.trained_positions else "")
    return (
        f"specroll bench --workload long-tail — {w.models.description}; {s.requests} requests "
        f"({math.ceil(s.requests / s.samples)} prompts × G={s.samples}) through {s.slots} slots (continuous "
        f"batching), max_seq_len {s.max_seq_len}, no stop token (every row runs to its budget), T={s.temperature:g}, "
        f"sampler {sampler}; budgets lognormal(median {s.median:g}, σ {s.sigma:g}) at its quantiles (i + 0.5)/"
        f"{s.requests}, capped at {w.cap}: distribution "
        + " / ".join(f"{k} {v:.0f}" for k, v in budgets["distribution_quantiles"].items()) + ", drawn "
        + " / ".join(f"{k} {v}" for k, v in budgets["drawn_quantiles"].items())
        + f", max {budgets['max']}, {budgets['total']} tokens in all; {s.repeats} repeat(s), lockstep groups: "
        + " | ".join(",".join(c.name for c in g) for g in groups)
        + f" (≈ {machine['engine_bytes_estimate'] / 1e9:.1f} GB per engine, mostly its KV cache); {extrapolated}"
        f"fp32 CPU, torch threads {machine['torch_threads']} of {machine['cpu_count']} cores, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start"
    )


def run(args: argparse.Namespace) -> int:
    import gc

    import torch

    from specroll.rollout import SamplingParams
    from specroll.rollout.config import SAMPLER_NAMES

    from .grpo_bench import race_repeat
    from .long_tail_report import print_table, summarize
    from .results import write_json

    s = settings_from(args)
    if args.sampler not in SAMPLER_NAMES:
        raise _invalid(f"--sampler={args.sampler!r} is invalid: one of {SAMPLER_NAMES}")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    w = load_workload(args, s)
    heads, skipped = trained_heads(w.models, s.kinds, fresh=args.models == "tiny")
    engines = Engines(w.models, heads, s.slots, s.max_seq_len, s.layer_skip, args.sampler)
    contenders = [c for c in s.contenders if c.kind not in skipped]
    engine_bytes = ENGINE_OVERHEAD * kv_cache_bytes(w.models.target, s.slots, s.max_seq_len)
    groups = lockstep_groups(contenders, group_size(s.group, len(contenders) - 1, engine_bytes))
    budgets = budget_stats(s, w)
    machine = {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "dtype": "float32",
               "torch": torch.__version__, "load_average_start": os.getloadavg(),
               "memory_available_bytes": memory_available(), "engine_bytes_estimate": engine_bytes}
    header = describe(s, w, budgets, groups, machine, args.sampler)
    print(header, flush=True)
    for kind, why in skipped.items():
        print(f"  skipped {kind}: {why}", flush=True)
    available = machine["memory_available_bytes"]
    if available is not None and available < 2 * engine_bytes:
        print(f"  warning: {available / 1e9:.1f} GB of memory available, and a lockstep group (plain and one more) "
              f"needs ≈ {2 * engine_bytes / 1e9:.1f} GB: shrink --long-tail-slots or --long-tail-max-seq-len",
              flush=True)
    out = Path(args.out or "bench_results/long_tail.json")
    report: dict = {
        "header": header, "machine": machine, "runs": [],
        "workload": {"requests": s.requests, "prompts": math.ceil(s.requests / s.samples), "samples": s.samples,
                     "slots": s.slots, "max_seq_len": s.max_seq_len, "temperature": s.temperature,
                     "sampler": args.sampler, "stop_token": None, "repeats": s.repeats, "small_batch": s.small_batch,
                     "budgets": budgets, "trained_positions": w.trained_positions,
                     "groups": [[c.name for c in g] for g in groups], "skipped": skipped},
    }
    write_json(out, report)

    runs: list[dict] = []
    with collecting_engines():
        engines.warm_up(contenders, w.prompts[0])
        for rep in range(s.repeats):
            # One seed per repeat: plain decoding writes the same texts in every group of a repeat.
            params = SamplingParams(max_new_tokens=max(w.budgets), temperature=s.temperature, seed=1000 * rep)
            for index, group in enumerate(groups):
                tallies = race_repeat({c.name: engines.build(c) for c in group}, w.prompts, [params], None, w.budgets)
                gc.collect()  # the group's engines, before the next group's are built
                runs.append({"repeat": rep, "group": index, "tallies": tallies})
                tokens = {k: t.tokens for k, t in tallies.items()}
                seconds = {k: t.seconds for k, t in tallies.items()}
                report["runs"].append({"repeat": rep, "group": index, "tokens": tokens, "seconds": seconds})
                print(f"  repeat {rep + 1}, group {index + 1}: "
                      + ", ".join(f"{k}={tokens[k] / seconds[k]:.0f} tok/s" for k in tallies), flush=True)
                report["contenders"] = summarize(runs, s.small_batch)
                write_json(out, report)
    load, end = machine["load_average_start"], os.getloadavg()
    machine["load_average_end"], report["seconds"] = end, time.perf_counter() - started
    print(f"\nLong-tail workload, {s.repeats} repeat(s); torch threads {torch.get_num_threads()} of {os.cpu_count()} "
          f"cores; load average {load[0]:.2f} at start, {end[0]:.2f} {end[1]:.2f} {end[2]:.2f} at the end")
    print_table(report["contenders"], s.small_batch)
    print(f"\nwrote {out} in {report['seconds']:.0f} s")
    write_json(out, report)
    return 0
