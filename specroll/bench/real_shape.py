"""`specroll bench --workload real-shape`: at which live batch speculation pays, at a real model shape, on this machine.

A Qwen2.5-0.5B-shaped target (494M, tied 152k head) built from its config (random init, no downloads:
`shapes`), and a drafter of each kind on it: two independent small LMs with their own 152k heads (2 layers × 384,
and gpu_check's 4 × 256), an EAGLE-style head, an EAGLE-3 head (low / middle / high layers fused, the target's
head) and Medusa heads on the target's features and head, layer-skip (the
target's first k layers) — each with and without a draft vocabulary of N ids (`EngineConfig.draft_vocab`) — and
the suffix drafter (a host lookup). From one run it prints:

1. the target's forward time by (live batch, query length), in ms and in plain steps (one token per row);
2. each drafter's draft cost per token (max γ drafts: a catch-up draft and single ones, averaged) in plain steps,
   and the break-even acceptance below which no γ pays;
3. each drafter's ceiling per live batch at each stated acceptance α (`real_shape_costs`): below 1, speculation
   does not pay at that batch on this hardware, whatever the engine does;
4. the auto-γ check (`real_shape_check`): the `gamma: "auto"` engine whose calibration the table is runs greedy
   batches at several live batch sizes with the 2×384 LM's cost and a stated acceptance, and the γ it chose per
   step is held against the table. `--auto-calibration-budget 8` runs the check on an engine calibrated within
   `EngineConfig`'s default budget instead (what a user's `gamma: auto` gets), still against the full table.

The numbers are the engine's own: the target's forward grid is the auto-γ engine's calibration
(`gamma.calibration.calibrate`, 64 tokens of context), each drafter's its `time_drafts`. fp32; the header states
the machine's load, torch threads and cores. `--vocab-size` and `--target-layers` shrink the shape for a smoke run.
This module imports nothing heavy before `run`.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .real_shape_costs import DrafterSpec
    from .shapes import Shape

PROMPT_LEN = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload's own flags; it also reads `--batch-sizes`, `--threads` and `--out` (`engine_bench`)."""
    group = parser.add_argument_group("--workload real-shape")
    group.add_argument("--acceptances", default="0.6,0.8", help="per-draft acceptances α of the ceilings")
    group.add_argument("--query-lens", default="1,2,3,4,5",
                       help="query lengths of the forward table; the largest, minus one, is the max γ")
    group.add_argument("--draft-vocab", type=int, default=32768,
                       help="N of the draft-vocabulary rows (EngineConfig.draft_vocab; 0: none)")
    group.add_argument("--layer-skip-layers", type=int, default=0,
                       help="k of the layer-skip drafter (0: a quarter of the target's layers)")
    group.add_argument("--vocab-size", type=int, default=0, help="shrink the vocabulary (0: the real 151,936)")
    group.add_argument("--target-layers", type=int, default=0, help="shrink the target's depth (0: the real 24)")
    group.add_argument("--auto-batches", default="",
                       help="live batch sizes of the auto-γ check (default: --batch-sizes)")
    group.add_argument("--auto-acceptance", type=float, default=0.8, help="the check drafter's per-draft acceptance")
    group.add_argument("--auto-tokens", type=int, default=16, help="greedy tokens per row of each check batch")
    group.add_argument("--calibration-budget", type=float, default=900.0,
                       help="seconds the auto-γ calibration may take (past it, large batches are extrapolated)")
    group.add_argument("--auto-calibration-budget", type=float, default=0.0,
                       help="the check engine's own calibration budget (0: the check runs on the table's engine; "
                            "8: EngineConfig's default, what a user's gamma: auto measures before extrapolating)")
    group.add_argument("--calibration-cache", default=None,
                       help="folder of the calibration cache (default: a fresh one, so the run measures)")
    group.add_argument("--seed", type=int, default=0)


def _invalid(message: str) -> Exception:
    """A bad flag: `specroll` prints it as one line, exit code 2 (`ConfigError` is a `ValueError`)."""
    from specroll.integrations.yaml_config import ConfigError

    return ConfigError(message)


def _ints(flag: str, text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",")})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise _invalid(f"{flag}={text!r} is invalid: comma-separated ints >= 1")
    return values


def _settings(args: argparse.Namespace) -> dict:
    batches = _ints("--batch-sizes", args.batch_sizes)
    query_lens = _ints("--query-lens", args.query_lens)
    if query_lens[-1] < 2:
        raise _invalid(f"--query-lens={args.query_lens!r} is invalid: the largest must be >= 2 (γ >= 1)")
    auto_batches = _ints("--auto-batches", args.auto_batches) if args.auto_batches else batches
    if auto_batches[-1] > batches[-1]:
        raise _invalid(f"--auto-batches={args.auto_batches!r} is invalid: at most the largest --batch-sizes "
                         f"({batches[-1]}), the engine's slots")
    try:
        alphas = [float(a) for a in args.acceptances.split(",")]
    except ValueError:
        alphas = []
    if not alphas or not all(0 < a <= 1 for a in [*alphas, args.auto_acceptance]):
        raise _invalid(f"--acceptances={args.acceptances!r} / --auto-acceptance={args.auto_acceptance!r} are "
                         "invalid: numbers in (0, 1]")
    for flag in ("draft_vocab", "layer_skip_layers", "vocab_size", "target_layers"):
        if getattr(args, flag) < 0:
            raise _invalid(f"--{flag.replace('_', '-')}={getattr(args, flag)} is invalid: an int >= 0")
    if args.auto_calibration_budget < 0:
        raise _invalid(f"--auto-calibration-budget={args.auto_calibration_budget} is invalid: >= 0 (0: the table's)")
    if args.auto_tokens < 1 or args.calibration_budget <= 0:
        raise _invalid(f"--auto-tokens={args.auto_tokens} / --calibration-budget={args.calibration_budget} are "
                         "invalid: >= 1 / > 0")
    return {"batches": batches, "query_lens": query_lens, "max_gamma": query_lens[-1] - 1,
            "auto_batches": auto_batches, "alphas": alphas}


def run(args: argparse.Namespace) -> int:
    import tempfile
    from dataclasses import asdict, replace

    import torch

    from specroll.rollout import EngineConfig
    from specroll.rollout.models.timing import CALIBRATION_CONTEXT

    from .real_shape_check import DISTINCT_PROMPTS, auto_engine, check, reference_completions
    from .real_shape_costs import drafter_row, forward_rows, random_prompts, time_drafter, with_drafter
    from .results import write_json
    from .shapes import params_m

    s = _settings(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    started, load_start = time.perf_counter(), os.getloadavg()
    models = build_models(args)
    target, specs = models.target, models.specs
    check_spec = specs[0]  # the check drafter's cost: the 2×384 LM's
    header = (f"specroll bench --workload real-shape — target {params_m(target):.1f}M params ({models.description}), "
              f"random init; fp32 CPU, torch threads {torch.get_num_threads()} of {os.cpu_count()} cores, load "
              f"average {' / '.join(f'{x:.2f}' for x in load_start)} at start; {CALIBRATION_CONTEXT} tokens of "
              f"context; γ ≤ {s['max_gamma']}; draft vocabulary N = {args.draft_vocab or 'none'} (the first N ids)")
    print(header, flush=True)
    out = Path(args.out or "bench_results/real_shape.json")
    report: dict = {"header": header, "settings": {**s, "draft_vocab": args.draft_vocab or None,
                                                   "auto_acceptance": args.auto_acceptance,
                                                   "auto_tokens": args.auto_tokens, "context": CALIBRATION_CONTEXT},
                    "machine": {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                "dtype": "float32", "torch": torch.__version__, "load_average_start": load_start},
                    "target": {"shape": models.shape._asdict(), "params_m": params_m(target)}}

    # The auto-γ engine first: its calibration is the table's target half.
    prompts = random_prompts(min(DISTINCT_PROMPTS, s["auto_batches"][-1]), PROMPT_LEN, models.shape.vocab, args.seed)
    max_seq_len = max(CALIBRATION_CONTEXT, PROMPT_LEN + args.auto_tokens + 1)
    references = reference_completions(target, prompts, args.auto_tokens, max_seq_len)
    calibration_started = time.perf_counter()
    with tempfile.TemporaryDirectory() as fresh:
        config = EngineConfig(max_batch_size=s["batches"][-1], max_seq_len=max_seq_len, gamma="auto",
                              max_gamma=s["max_gamma"], cost_model_budget_s=args.calibration_budget,
                              calibration_cache=args.calibration_cache or fresh)
        engine = auto_engine(target, check_spec.weights, references, args.auto_acceptance, config)
    calibration_s = time.perf_counter() - calibration_started
    cost = engine.gamma_policy.cost  # the calibration `gamma: "auto"` decides on
    report["calibration"] = {"seconds": calibration_s, "budget_s": args.calibration_budget,
                             "target": asdict(cost.target), "contexts": list(cost.contexts),
                             "over_budget": calibration_s >= args.calibration_budget}
    report["forward"] = forward_rows(cost, s["batches"], s["query_lens"])
    print_forward(report)
    write_json(out, report)

    report["drafters"] = []
    for spec in specs:
        times = cost.drafter if spec is check_spec else time_drafter(
            target, spec, config, cost.target.batch_sizes, args.calibration_budget)
        report["drafters"].append(drafter_row(spec, with_drafter(cost, times), s["batches"], s["alphas"],
                                              s["max_gamma"]))
        write_json(out, report)
    print_drafters(report)

    if args.auto_calibration_budget:  # a check engine calibrated as a user's would be, against the full table
        del engine
        with tempfile.TemporaryDirectory() as fresh:
            engine = auto_engine(target, check_spec.weights, references, args.auto_acceptance,
                                 replace(config, cost_model_budget_s=args.auto_calibration_budget,
                                         calibration_cache=fresh))
    rows = check(engine, cost, prompts, s["auto_batches"], args.auto_tokens, args.auto_acceptance)
    report["auto_check"] = {"drafter": check_spec.name, "alpha": args.auto_acceptance, "tokens": args.auto_tokens,
                            "calibration_budget_s": args.auto_calibration_budget or args.calibration_budget,
                            "calibration_target": asdict(engine.gamma_policy.cost.target),
                            "rows": rows, "all_agree": all(r["agrees"] for r in rows)}
    report["machine"]["load_average_end"] = os.getloadavg()
    report["seconds"] = time.perf_counter() - started
    print_check(report)
    write_json(out, report)
    print(f"\nwrote {out} in {report['seconds']:.0f} s (calibration {calibration_s:.0f} s); load average at the end "
          f"{report['machine']['load_average_end'][0]:.2f}")
    return 0


@dataclass
class Models:
    """The workload's target (tied head, as Qwen2.5-0.5B's) and the table's drafters, the check's first."""

    shape: Shape
    description: str
    target: PreTrainedModel
    specs: list[DrafterSpec]


def build_models(args: argparse.Namespace) -> Models:
    from .real_shape_costs import DrafterSpec
    from .shapes import SHAPES, build

    real = SHAPES["target"]
    shape = real._replace(vocab=args.vocab_size or real.vocab, layers=args.target_layers or real.layers)
    if args.draft_vocab > shape.vocab:
        raise _invalid(f"--draft-vocab={args.draft_vocab} is invalid: at most the vocabulary ({shape.vocab})")
    which = "Qwen2.5-0.5B shape" if shape == real else f"Qwen2.5-0.5B shape shrunk to {shape.layers} layers"
    target = build(shape, seed=args.seed, tied=True)
    lms = [build(SHAPES[kind]._replace(vocab=shape.vocab), seed=args.seed + i, tied=True)
           for i, kind in enumerate(("drafter_2x384", "drafter"), start=1)]
    skip = args.layer_skip_layers or max(1, shape.layers // 4)
    specs = []
    for name, kinds, weights, layers in (("lm_2x384", ("model",), lms[0], None), ("lm_4x256", ("model",), lms[1], None),
                                         ("eagle", ("eagle",), None, None), ("eagle3", ("eagle3",), None, None),
                                         ("block", ("block",), None, None), ("medusa", ("medusa",), None, None),
                                         ("recurrent", ("recurrent",), None, None),
                                         (f"layer_skip{skip}", ("layer_skip",), None, skip)):
        specs.append(DrafterSpec(name, kinds, weights, None, layers))
        if args.draft_vocab:
            specs.append(DrafterSpec(f"{name}+dv{args.draft_vocab}", kinds, weights, args.draft_vocab, layers))
    specs.append(DrafterSpec("suffix", ("suffix",)))
    return Models(shape, f"{which}, V = {shape.vocab:,}, tied head", target, specs)


def print_forward(report: dict) -> None:
    rows = report["forward"]
    lens = sorted({r["query_len"] for r in rows})
    print("\nTarget forward by live batch × query length (tokens per row): ms (plain steps)")
    print("| live batch | " + " | ".join(f"Q = {q}" for q in lens) + " |")
    print("|---|" + "---|" * len(lens))
    for b in sorted({r["batch"] for r in rows}):
        cells = [f"{r['seconds'] * 1e3:.0f} ({r['plain_steps']:.2f})" + ("" if r["on_grid"] else "*")
                 for r in rows if r["batch"] == b]
        print(f"| {b} | " + " | ".join(cells) + " |")
    if not all(r["on_grid"] for r in rows):
        print("* interpolated between calibrated points")
    if report["calibration"]["over_budget"]:
        print("calibration reached --calibration-budget: its largest batches are extrapolated, not measured")


def print_drafters(report: dict) -> None:
    drafters = report["drafters"]
    batches = [c["batch"] for c in drafters[0]["per_batch"]]
    alphas = report["settings"]["alphas"]
    head = "| drafter | " + " | ".join(f"b = {b}" for b in batches) + " |"
    rule = "|---|" + "---|" * len(batches)
    print(f"\nDraft cost per token in plain steps at γ = {report['settings']['max_gamma']} (break-even acceptance α*)")
    print(head + "\n" + rule)
    for d in drafters:
        print(f"| {d['name']} | " + " | ".join(
            f"{c['draft_per_token_plain_steps']:.3f} (α* {c['break_even_alpha']:.2f})" for c in d["per_batch"]) + " |")
    print(f"\nCeiling (zero-overhead speedup over plain, best γ) at α = {' / '.join(map(str, alphas))}")
    print(head + "\n" + rule)
    for d in drafters:
        print(f"| {d['name']} | " + " | ".join(" / ".join(
            f"{c['ceilings'][str(a)]['speedup']:.2f}× γ{c['ceilings'][str(a)]['gamma']}" for a in alphas)
            for c in d["per_batch"]) + " |")


def print_check(report: dict) -> None:
    check = report["auto_check"]
    print(f"\nAuto-γ check: gamma \"auto\" calibrated within {check['calibration_budget_s']:g} s, {check['drafter']}'s "
          f"cost, acceptance {check['alpha']}, greedy, {check['tokens']} tokens per row; the ceiling is the table's")
    print("| live batch | table ceiling (best γ) | table says | γ per step | speculative steps | α seen | "
          "auto | agrees |")
    print("|---|---|---|---|---|---|---|---|")
    for r in check["rows"]:
        acceptance = "—" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        agrees = ("yes (marginal)" if r["marginal"] else "yes") if r["agrees"] else "NO"
        gammas = ",".join(map(str, r["gammas"][:24])) + ("…" if len(r["gammas"]) > 24 else "")
        print(f"| {r['batch']} | {r['ceiling']:.2f}× (γ{r['table_gamma']}) | {r['table_says']} | {gammas} | "
              f"{100 * r['speculative_share']:.0f}% | {acceptance} | {r['verdict']} | {agrees} |")
