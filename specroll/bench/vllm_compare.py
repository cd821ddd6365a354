"""specroll beside vLLM, side by side: the engine a user would otherwise run is the baseline of every ratio.

    python -m specroll.bench.vllm_compare --models demo-bpe --rows 1,16,64 --new-tokens 128 --repeats 3

Contenders, on the same target, drafter and prompts: vLLM plain (`vllm_plain`, the baseline), vLLM speculating
with the drafter LM at γ (`vllm_spec`), specroll's engine plain and at the same γ (`specroll_plain`,
`specroll_spec`), and TRL's own path without vLLM, Hugging Face `generate` (`hf_generate`, `--hf`). `--auto` adds
vLLM with `gamma: auto` (`vllm_auto`: drafts per live batch size, up to γ, from vLLM's timed step costs,
`integrations.vllm.gamma`). `--run DIR` takes a finished `specroll train` run (its `policy/` and `drafter/`
folders): the target is the trained policy, the frozen drafter the one the run started from (`vllm_spec`,
`specroll_spec`), and the drafter the run's online learner published last speculates too (`vllm_online`,
`specroll_online`; with `--auto` also `vllm_auto_online`). Two workloads:
a fixed live batch (`--rows` prompts, no stop token, `--new-tokens` each: every row live to the end) at greedy and
T = 1, and the GRPO-shaped one (`--grpo-prompts` task prompts × G siblings at T = 1, stop at EOS, up to
`--grpo-max-tokens`). Every repeat runs every contender once, in turn (never two at once: vLLM's CPU threads
busy-wait), and each ratio is the mean of per-repeat ratios with a 95 % t-interval (`engine_race.paired_ratio`).
Speculative contenders also print their acceptance (drafts kept / drafts proposed). The vLLM engines run with
specroll's repair of vLLM's CPU T > 0 defect (`integrations.vllm.cpu_fixes`); results as JSON with `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

from .contenders import hf_generate
from .engine_race import paired_ratio
from .models import BenchModels, load_bench_models

BASELINE = "vllm_plain"
WARMUP_TOKENS = 8  # each contender's untimed pass before a workload's repeats


@dataclass
class Engine:
    """One contender: `generate` returns the tokens it produced; `stats` its engine's counters (None for HF)."""

    name: str
    generate: Any
    stats: Any = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="demo-bpe",
                        help="demo-bpe (default), demo, real-shape or tiny (a smoke run)")
    parser.add_argument("--rows", default="1,16,64", help="live batch sizes of the fixed workload (comma list)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperatures", default="0,1", help="the fixed workload's temperatures (comma list)")
    parser.add_argument("--gamma", type=int, default=3, help="drafts per step of both speculative engines")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grpo-prompts", type=int, default=4, help="0: skip the GRPO-shaped workload")
    parser.add_argument("--grpo-generations", type=int, default=8)
    parser.add_argument("--grpo-max-tokens", type=int, default=320)
    parser.add_argument("--hf", action="store_true", help="also Hugging Face generate (TRL's path without vLLM)")
    parser.add_argument("--auto", action="store_true", help="also vLLM with gamma: auto (max_gamma = --gamma)")
    parser.add_argument("--run", default=None, help="a finished specroll train run: its policy and online drafter")
    parser.add_argument("--skip-fixed", action="store_true", help="the GRPO-shaped workload only")
    parser.add_argument("--out", default=None, help="write the results as JSON here")


def build(models: BenchModels, args: argparse.Namespace, max_batch: int, max_seq_len: int) -> list[Engine]:
    from specroll.integrations.vllm.settings import VllmSettings

    settings = VllmSettings(kv_cache_gib=2)
    base = EngineConfig(max_batch_size=max_batch, max_seq_len=max_seq_len)
    plain, spec = replace(base, gamma=0), replace(base, gamma=args.gamma)
    auto = replace(base, gamma="auto", max_gamma=args.gamma, drafters=("model",))
    drafters = {"spec": models.drafter}
    if args.run:
        from transformers import AutoModelForCausalLM

        models = replace(models, target=AutoModelForCausalLM.from_pretrained(f"{args.run}/policy"))
        drafters["online"] = AutoModelForCausalLM.from_pretrained(f"{args.run}/drafter")
    engines = [_vllm(BASELINE, models.target, None, plain, settings)]
    for name, drafter in drafters.items():
        engines.append(_vllm(f"vllm_{name}", models.target, drafter, replace(spec, drafters=("model",)), settings))
        if args.auto:
            suffix = "" if name == "spec" else f"_{name}"
            engines.append(_vllm(f"vllm_auto{suffix}", models.target, drafter, auto, settings))
    ours_plain = SpecEngine(models.target, None, plain)
    engines.append(Engine("specroll_plain", _engine_run(ours_plain), ours_plain.stats))
    for name, drafter in drafters.items():
        ours = SpecEngine(models.target, drafter, spec)
        engines.append(Engine(f"specroll_{name}", _engine_run(ours), ours.stats))
    if args.hf:
        hf = hf_generate(models.target, models.pad_id)
        engines.append(Engine(hf.name, hf.run))
    return engines


def _vllm(name: str, target, drafter, config: EngineConfig, settings) -> Engine:
    from specroll.integrations.vllm.engine import VllmEngine

    engine = VllmEngine.from_models(target, drafter, config, settings)
    return Engine(name, _engine_run(engine), engine.stats)


def _engine_run(engine):
    def run(prompts: list[list[int]], budgets: list[int], params: SamplingParams, n: int = 1) -> int:
        rollouts = engine.generate(prompts, params, n=n, max_new_tokens=budgets)
        return sum(len(r.completion_ids) for r in rollouts)

    return run


def race(engines: list[Engine], prompts: list[list[int]], budgets: list[int], params: SamplingParams, n: int,
         repeats: int) -> dict[str, dict]:
    """Every contender once per repeat, in turn, after one untimed short pass each (vLLM's first calls of a shape
    are slow); tokens/s per repeat, acceptance over the timed repeats."""

    def run(engine: Engine, limit: int | None = None) -> int:
        cut = budgets if limit is None else [min(limit, b) for b in budgets]
        if engine.stats is not None:
            return engine.generate(prompts, cut, params, n)
        return engine.generate([p for p in prompts for _ in range(n)], [b for b in cut for _ in range(n)], params)

    for engine in engines:
        run(engine, limit=WARMUP_TOKENS)
    per_repeat: dict[str, list[float]] = {e.name: [] for e in engines}
    before = {e.name: e.stats.totals() for e in engines if e.stats is not None}
    for _ in range(repeats):
        for engine in engines:
            started = time.perf_counter()
            tokens = run(engine)
            per_repeat[engine.name].append(tokens / (time.perf_counter() - started))
    out = {}
    for engine in engines:
        entry = {"tokens_per_s": statistics.fmean(per_repeat[engine.name]),
                 "per_repeat_tokens_per_s": per_repeat[engine.name]}
        if engine.name != BASELINE:
            entry["vs_vllm_plain"] = paired_ratio(per_repeat[engine.name], per_repeat[BASELINE])
        if engine.stats is not None:
            batch = engine.stats.since(before[engine.name])
            entry["acceptance"] = batch.accepted / batch.drafted if batch.drafted else None
        out[engine.name] = entry
    return out


def print_table(title: str, result: dict[str, dict]) -> None:
    print(f"\n{title}")
    print(f"{'contender':<18}{'tok/s':>9}  {'x vllm_plain [95% CI]':<26}{'acceptance':>11}")
    for name, entry in result.items():
        ratio = entry.get("vs_vllm_plain")
        shown = "1 (baseline)" if ratio is None else f"{ratio['mean']:.2f} [{ratio['lo']:.2f}, {ratio['hi']:.2f}]"
        acceptance = entry.get("acceptance")
        kept = "" if acceptance is None else f"{acceptance:.3f}"
        print(f"{name:<18}{entry['tokens_per_s']:>9.1f}  {shown:<26}{kept:>11}")


def run(args: argparse.Namespace) -> int:
    rows = [int(r) for r in args.rows.split(",") if r]
    temperatures = [float(t) for t in args.temperatures.split(",") if t]
    models = load_bench_models(args.models, max([*rows, args.grpo_prompts]), seed=0)
    longest = max(map(len, models.prompts))
    max_seq = longest + max(args.new_tokens, args.grpo_max_tokens) + args.gamma + 8
    max_batch = max([*rows, args.grpo_prompts * args.grpo_generations])
    engines = build(models, args, max_batch, max_seq)
    load = os.getloadavg()[0]
    print(f"specroll vs vLLM: {models.description}; γ = {args.gamma}; {args.repeats} repeats; torch threads "
          f"{torch.get_num_threads()}; load {load:.1f} at start")
    results: dict[str, Any] = {"settings": vars(args), "description": models.description, "load_at_start": load}
    if not args.skip_fixed:
        for temperature in temperatures:
            for b in rows:
                params = SamplingParams(max_new_tokens=args.new_tokens, temperature=temperature, seed=7)
                result = race(engines, models.prompts[:b], [args.new_tokens] * b, params, 1, args.repeats)
                print_table(f"live batch {b}, T = {temperature:g}, {args.new_tokens} tokens a row", result)
                results[f"rows{b}_T{temperature:g}"] = result
    if args.grpo_prompts:
        params = SamplingParams(max_new_tokens=args.grpo_max_tokens, temperature=1.0,
                                stop_token_ids=models.stop_token_ids, seed=11)
        prompts = models.prompts[:args.grpo_prompts]
        result = race(engines, prompts, [args.grpo_max_tokens] * len(prompts), params, args.grpo_generations,
                      args.repeats)
        print_table(f"GRPO-shaped: {len(prompts)} prompts x G = {args.grpo_generations}, T = 1, stop at EOS", result)
        results["grpo"] = result
    results["load_at_end"] = os.getloadavg()[0]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
