"""`specroll bench`: specroll against HF generate and HF assisted generation, ratios from one run.

Two parts, same target, drafter, prompts and sampling for every contender, interleaved so machine
noise hits all of them alike: each repeat runs every HF contender once, in turn, and all specroll
engines in lockstep (one engine step each, in turn, timed per engine):

1. A grid over batch sizes × {greedy, T = 1}: HF `generate` (batched, left-padded), HF assisted
   generation (batch 1 only — it refuses more — default schedule and constant k ∈ {2, 4, 8}),
   specroll plain (γ = 0), specroll at fixed γ, and specroll `gamma="auto"`. Greedy rows end at the
   stop token (every contender emits the same tokens); sampled rows run to the token budget (with
   a stop token, each contender's own luck in when rows end swamps the differences measured).
2. A rollout-shaped workload: many requests with long-tailed (lognormal) token budgets through
   `max_batch_size` slots with continuous batching, no stop token (every contender does the same
   work), plain vs fixed γ vs auto.
3. A GRPO-shaped workload (`grpo_bench`): P prompts × G = 8 samples at T = 1 with the stop token, two
   epochs, plain vs the model drafter vs the suffix drafter vs both, with each one's ceiling.

`--workload real-shape` runs `real_shape` instead: a Qwen2.5-0.5B-shaped target's forward and each drafter's
draft cost, the ceiling per drafter and live batch, and a check of auto-γ against it. `--workload long-tail`
runs `long_tail`: completion budgets into the thousands of tokens, each drafter at auto-γ against plain decoding,
and how much of the wall time the drained batch (live ≤ 4) takes.

Every speculative contender uses `--sampler` (`EngineConfig.sampler`). Prints tokens/s and ratios,
and writes the JSON file after every finished cell, so an interrupted run keeps what it measured. The
races live in `engine_race`; this module imports nothing heavy before `--help` is answered.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import long_tail, real_shape
from .results import write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="engine", choices=["engine", "real-shape", "long-tail"],
                        help="engine: the races below (default); real-shape: `real_shape`'s cost table, auto-γ "
                             "check; long-tail: `long_tail`'s rollouts of long-tailed budgets")
    parser.add_argument("--models", default="demo", choices=["demo", "demo-bpe", "tiny"])
    parser.add_argument("--batch-sizes", default="1,4,16,64")
    parser.add_argument("--modes", default="greedy,sample")
    parser.add_argument("--gammas", default="2,4,8")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-hf", action="store_true", help="skip the HF contenders (grid part)")
    parser.add_argument("--no-grid", action="store_true", help="run only the rollout-shaped workload")
    parser.add_argument("--rollout-requests", type=int, default=128, help="0 skips the rollout workload")
    parser.add_argument("--rollout-batch", type=int, default=16)
    parser.add_argument("--rollout-cap", type=int, default=512)
    parser.add_argument("--rollout-repeats", type=int, default=1)
    parser.add_argument("--auto-policies", default="auto",
                        help="comma-separated auto-γ policies (EngineConfig.gamma names), 'auto' first")
    parser.add_argument("--out", default=None,
                        help="JSON file (default bench_results/engine_bench.json, real_shape.json or long_tail.json)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--sampler", default="rejection",
                        help="accept rule of every speculative contender (EngineConfig.sampler; default rejection)")
    parser.add_argument("--grpo-prompts", type=int, default=16, help="P prompts of the GRPO workload (0 skips it)")
    parser.add_argument("--grpo-samples", type=int, default=8, help="G samples per prompt")
    parser.add_argument("--grpo-slots", type=int, default=32, help="batch slots of the GRPO workload")
    parser.add_argument("--grpo-epochs", type=int, default=2)
    parser.add_argument("--grpo-repeats", type=int, default=4)
    parser.add_argument("--grpo-max-new-tokens", type=int, default=128)
    parser.add_argument("--grpo-gamma", default="auto", help="γ of every speculative GRPO contender: an int or 'auto'")
    parser.add_argument("--grpo-contenders", default="plain,model,suffix,suffix+model",
                        help="comma-separated, from plain, model, suffix, suffix+model")
    real_shape.add_arguments(parser)
    long_tail.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.workload == "real-shape":
        return real_shape.run(args)
    if args.workload == "long-tail":
        return long_tail.run(args)
    import torch

    from specroll.rollout.config import SAMPLER_NAMES

    from .engine_race import grid, rollout_workload
    from .models import load_bench_models

    if args.sampler not in SAMPLER_NAMES:
        raise ValueError(f"--sampler={args.sampler!r} is invalid: one of {SAMPLER_NAMES}")
    if args.threads:
        torch.set_num_threads(args.threads)
    gammas = [int(g) for g in args.gammas.split(",")]
    num_prompts = max(max(int(b) for b in args.batch_sizes.split(",")), 16, args.grpo_prompts)
    models = load_bench_models(args.models, num_prompts=num_prompts)
    header = (f"specroll bench — {models.description}; max_new_tokens={args.max_new_tokens}, "
              f"repeats={args.repeats} interleaved, torch threads={torch.get_num_threads()}, fp32 CPU, "
              f"sampler={args.sampler}")
    print(header, flush=True)
    out = Path(args.out or "bench_results/engine_bench.json")
    report: dict = {"header": header}

    def record(part: str):
        def write(rows: list[dict]) -> None:
            report[part] = rows
            write_json(out, report)
        return write

    if not args.no_grid:
        grid(models, args, gammas, record("grid"))
    if args.rollout_requests:
        rollout_workload(models, args, gammas, record("rollout_workload"))
    if args.grpo_prompts:
        from .grpo_bench import grpo_workload

        report["grpo_workload"] = grpo_workload(models, args)
    write_json(out, report)
    print(f"\nwrote {out}")
    return 0

