"""`python -m specroll.bench.overlap`: drafting beside verification (`engine.overlap`) against the serial engine at
the same total cores.

    python -m specroll.bench.overlap --models demo --batch 1 4 16 --repeats 4          # a quiet machine, minutes
    python -m specroll.bench.overlap --models tiny --batch 1 4 --repeats 2 --new-tokens 8   # smoke run, seconds

Three engines on the same models and prompts, per live batch size b: "serial" (the drafter in series with the
target, both on every core), "placed_serial" (the drafter on its own cores, `--drafter-cores`, the target on the
rest, still in series: what the split alone costs) and "overlapped" (the same split, drafting ahead). On a CUDA target
(`--device cuda`) the drafter goes to the host CPU instead. Each repeat runs every engine once over the same prompts,
in an order rotated per repeat (interleaved), with a fresh seed per repeat shared by the engines (paired): the ratio
per repeat cancels most of the machine's drift; the table gives its mean and 95 % interval over the repeats.

Beside the rates it measures the parts that bound them, with the engines' own calibration timers (fastest of repeats,
after the races): D the γ drafts and V the target's verification forward of γ + 1 tokens, each on all cores and on its
side of the split. A step emits the same tokens either way, so the overlapped engine can at best reach
(D_all + V_all) / max(D_split, V_split) of the serial one's tokens/s — the ceiling — and reaches it only where every
row keeps its whole step and the drafter's guess (`kept ahead`: the share of rows that did).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.models.timing import time_forwards
from specroll.rollout.placement.ahead import AheadDrafter

from .engine_race import paired_ratio
from .models import load_bench_models
from .results import write_json

NAMES = ("serial", "placed_serial", "overlapped")


def _engines(models, batch: int, args) -> dict[str, SpecEngine]:
    placed = "cpu" if args.device.startswith("cuda") else f"cpu:{args.drafter_cores}"
    longest = max(len(p) for p in models.prompts)
    settings = {"serial": {}, "placed_serial": {"drafter_device": placed},
                "overlapped": {"drafter_device": placed, "overlap": True}}
    return {name: SpecEngine(models.target, models.drafter, EngineConfig(
        max_batch_size=batch, max_seq_len=longest + args.new_tokens + 1, gamma=args.gamma, device=args.device,
        **settings[name])) for name in NAMES}


def _costs(engine: SpecEngine, batch: int, gamma: int, budget_s: float) -> dict[str, float]:
    """D (γ drafts) and V (a verification forward of γ + 1 tokens) at `batch` rows, where this engine runs them."""
    deadline = time.perf_counter() + budget_s
    drafts = engine.drafter.time_drafts([batch], deadline)
    draft = drafts(batch, 2) + (gamma - 1) * drafts(batch, 1)
    cores = engine.target_cores  # the split's target side (None: every core)
    if cores is not None:
        cores.pin()
    try:
        verify = time_forwards(engine.target, [batch], [gamma + 1], deadline)(batch, gamma + 1)
    finally:
        if cores is not None:
            cores.unpin()
    return {"draft_s": draft, "verify_s": verify}


def run_cell(models, batch: int, args) -> dict:
    engines = _engines(models, batch, args)
    prompts = models.prompts[: batch * args.batches]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=args.temperature,
                            stop_token_ids=models.stop_token_ids, seed=args.seed)
    for engine in engines.values():  # warm-up: allocation and lazy init are not timed
        engine.generate(prompts[:1], replace(params, max_new_tokens=min(4, args.new_tokens)))
    rates: dict[str, list[float]] = {name: [] for name in NAMES}
    for rep in range(args.repeats):
        order = NAMES[rep % len(NAMES):] + NAMES[: rep % len(NAMES)]
        rep_params = replace(params, seed=args.seed + 1000 * rep)
        for name in order:
            started = time.perf_counter()
            out = engines[name].generate(prompts, rep_params)
            rates[name].append(sum(len(r.completion_ids) for r in out) / (time.perf_counter() - started))
    ahead = engines["overlapped"].drafter
    serial, split = (_costs(engines[name], batch, args.gamma, args.cost_budget_s) for name in ("serial", "overlapped"))
    cell = {
        "batch": batch, "tokens_per_s": {name: statistics.fmean(r) for name, r in rates.items()},
        "per_repeat_tokens_per_s": rates,
        "overlapped_vs_serial": paired_ratio(rates["overlapped"], rates["serial"]),
        "placed_serial_vs_serial": paired_ratio(rates["placed_serial"], rates["serial"]),
        "costs_all_cores": serial, "costs_split": split,
        "ceiling": (serial["draft_s"] + serial["verify_s"]) / max(split["draft_s"], split["verify_s"]),
        "kept_ahead": ahead.rows_kept_ahead / max(ahead.rows_ahead, 1),
    }
    for engine in engines.values():
        if isinstance(engine.drafter, AheadDrafter):
            engine.drafter.close()
    return cell


def _print(cell: dict) -> None:
    vs, costs, split = cell["overlapped_vs_serial"], cell["costs_all_cores"], cell["costs_split"]
    print(f"b={cell['batch']:>3}  tokens/s serial {cell['tokens_per_s']['serial']:8.1f}  placed serial "
          f"{cell['tokens_per_s']['placed_serial']:8.1f}  overlapped {cell['tokens_per_s']['overlapped']:8.1f}  "
          f"overlapped/serial {vs['mean']:.3f} (95% {vs['lo']:.3f}–{vs['hi']:.3f}, {vs['repeats']} repeats)  "
          f"D/V all {1e3 * costs['draft_s']:.1f}/{1e3 * costs['verify_s']:.1f} ms  split "
          f"{1e3 * split['draft_s']:.1f}/{1e3 * split['verify_s']:.1f} ms  ceiling {cell['ceiling']:.2f}x  "
          f"kept ahead {cell['kept_ahead']:.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specroll.bench.overlap", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="demo", choices=("demo", "demo-bpe", "tiny"))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16], help="live batch sizes")
    parser.add_argument("--batches", type=int, default=2, help="prompts per cell: this many times the batch size")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--drafter-cores", type=int, default=1, help="cores the drafter takes on a CPU target")
    parser.add_argument("--device", default="cpu", help="the target's device ('cuda': the drafter on the host CPU)")
    parser.add_argument("--cost-budget-s", type=float, default=2.0, help="seconds per measured D/V pair")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench_out/overlap.json"))
    args = parser.parse_args(argv)
    models = load_bench_models(args.models, max(args.batch) * args.batches, args.seed)
    where = "the host CPU" if args.device.startswith("cuda") else f"{args.drafter_cores} core(s)"
    print(f"# overlap vs serial: {models.description}; γ={args.gamma}, T={args.temperature}, {args.new_tokens} new "
          f"tokens, drafter on {where}, {args.repeats} paired repeats, interleaved", flush=True)
    cells = []
    for batch in args.batch:
        cells.append(run_cell(models, batch, args))
        _print(cells[-1])
        write_json(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "cells": cells})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
