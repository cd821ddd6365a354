"""The GRPO-shaped workload of `specroll bench`: what a rollout phase of the demo's GRPO run looks like.

P prompts × G samples (G = 8) at T = 1 with the stop token, through `slots` batch slots with
continuous batching, for two "epochs": the same prompts again with a new seed, the suffix drafter's
history kept from the first (one engine per contender and repeat, so each repeat starts with an empty
history). Contenders: plain decoding, the model drafter, the suffix drafter, and both with the per-row
choice (`EngineConfig.drafters`), all at the same γ setting, stepped in lockstep (always the one that
has generated the fewest tokens) so that machine noise hits them alike. The policy does not move
between the epochs here, unlike in training.

Per contender it prints tokens/s, the paired ratio to plain decoding and to the model drafter (mean
and 95 % t-interval over the repeats), each drafter's acceptance and mean accepted length, and the
**ceiling**: the tokens/s its own steps would reach if each cost only its calibrated forwards (the
target's at the step's rows, γ + 1 tokens and context; the model drafter's γ drafts for the rows it
served; suffix lookups free) — how close a contender runs to its own limit.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Generator
from dataclasses import dataclass, field

from specroll.rollout import EngineConfig, EngineStats, SamplingParams, SpecEngine
from specroll.rollout.config import SAMPLER_NAMES
from specroll.rollout.gamma.cost_model import CostModel

from .engine_race import paired_ratio
from .models import BenchModels

DRAFTERS = {"plain": None, "model": ("model",), "suffix": ("suffix",), "suffix+model": ("suffix", "model")}


@dataclass
class LiveBatchTally:
    """A contender's steps that ran at one live batch size, over a repeat."""

    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    gamma_sum: int = 0


@dataclass
class Tally:
    """One contender's totals over a repeat. `by_live_rows` splits its steps by the rows each ran at;
    its seconds add up to `seconds` (a call to the contender that ran no step, the generator's return,
    counts with the step before it)."""

    tokens: int = 0
    seconds: float = 0.0
    ceiling_seconds: float = 0.0  # Σ over its steps of their calibrated forward time (0: no cost model given)
    steps: int = 0
    by_drafter: dict = field(default_factory=dict)
    tree_steps: int = 0  # of `steps`, those that verified a token tree
    by_live_rows: dict[int, LiveBatchTally] = field(default_factory=dict)
    last_live_rows: int = 0

    def count_call(self, stats: EngineStats, before: tuple[int, int, int, int], seconds: float) -> None:
        """One call to the contender's step generator that took `seconds`; `before` is (steps, generated
        tokens, drafted, accepted) of its stats before the call."""
        steps, tokens, drafted, accepted = before
        ran = stats.steps > steps
        if ran:
            self.last_live_rows = stats.live_rows_per_step[-1]
        bucket = self.by_live_rows.setdefault(self.last_live_rows, LiveBatchTally())
        bucket.seconds += seconds
        if ran:
            bucket.steps += 1
            bucket.tokens += stats.generated_tokens - tokens
            bucket.drafted += stats.drafted - drafted
            bucket.accepted += stats.accepted - accepted
            bucket.gamma_sum += stats.gamma_per_step[-1]


def _gamma(text: str) -> int | str:
    return text if text == "auto" else int(text)


def build_engine(models: BenchModels, kind: str, slots: int, max_seq_len: int, gamma: int | str,
                 sampler: str = "rejection") -> SpecEngine:
    drafters = DRAFTERS[kind]
    config = EngineConfig(max_batch_size=slots, max_seq_len=max_seq_len, gamma=0 if drafters is None else gamma,
                          drafters=drafters, sampler=sampler, stats_trace_steps=1)
    return SpecEngine(models.target, models.drafter if drafters and "model" in drafters else None, config)


def _epochs(engine: SpecEngine, prompts: list[list[int]], params: list[SamplingParams],
            max_new_tokens: list[int] | None) -> Generator[None, None, None]:
    for epoch_params in params:
        yield from engine.generate_steps(prompts, epoch_params, max_new_tokens=max_new_tokens)


def _step_cost(engine: SpecEngine, cost: CostModel, model_rows_before: int) -> float:
    """Calibrated seconds of the engine's last step (from its stats' traces)."""
    stats = engine.stats
    gamma, rows, context = stats.gamma_per_step[-1], stats.live_rows_per_step[-1], stats.context_per_step[-1]
    model = stats.by_drafter.get("model")
    model_rows = (model.proposals if model else 0) - model_rows_before
    return cost.target_time(rows, gamma + 1, context) + (cost.draft_time(model_rows, gamma) if model_rows else 0.0)


def race_repeat(engines: dict[str, SpecEngine], prompts: list[list[int]], params: list[SamplingParams],
                cost: CostModel | None, max_new_tokens: list[int] | None = None) -> dict[str, Tally]:
    """Every engine through the epochs, in lockstep; each one's time is the sum of its own steps.
    `max_new_tokens`: one budget per prompt (each at most its params' `max_new_tokens`); `cost` None
    leaves the ceiling uncounted."""
    running = {name: _epochs(engine, prompts, params, max_new_tokens) for name, engine in engines.items()}
    tallies = {name: Tally() for name in engines}
    while running:
        name = min(running, key=lambda k: engines[k].stats.generated_tokens)
        engine, tally = engines[name], tallies[name]
        stats = engine.stats
        model = stats.by_drafter.get("model")
        model_rows = model.proposals if model else 0
        before = (stats.steps, stats.generated_tokens, stats.drafted, stats.accepted)
        started = time.perf_counter()
        try:
            next(running[name])
        except StopIteration:
            del running[name]
        spent = time.perf_counter() - started
        tally.seconds += spent
        tally.count_call(stats, before, spent)
        if cost is not None and stats.steps > before[0]:
            tally.ceiling_seconds += _step_cost(engine, cost, model_rows)
    for name, engine in engines.items():
        tallies[name].tokens = engine.stats.generated_tokens
        tallies[name].steps = engine.stats.steps
        tallies[name].tree_steps = engine.stats.tree_steps
        tallies[name].by_drafter = {k: v.to_dict() for k, v in engine.stats.by_drafter.items()}
    return tallies


def grpo_workload(models: BenchModels, args: argparse.Namespace) -> dict:
    kinds = args.grpo_contenders.split(",")
    unknown = [k for k in kinds if k not in DRAFTERS]
    if unknown:
        raise ValueError(f"grpo-contenders={args.grpo_contenders!r} is invalid: {unknown} not in {list(DRAFTERS)}")
    gamma = _gamma(args.grpo_gamma)
    sampler = getattr(args, "sampler", "rejection")
    if sampler not in SAMPLER_NAMES:
        raise ValueError(f"sampler={sampler!r} is invalid: one of {SAMPLER_NAMES}")
    base = models.prompts[: args.grpo_prompts]
    prompts = [p for p in base for _ in range(args.grpo_samples)]  # siblings consecutive, as TRL sends them
    max_seq = max(map(len, prompts)) + args.grpo_max_new_tokens + 1
    calibrated = SpecEngine(models.target, models.drafter, EngineConfig(
        max_batch_size=args.grpo_slots, max_seq_len=max_seq, gamma="auto",
        max_gamma=gamma if isinstance(gamma, int) else EngineConfig().max_gamma))
    cost = calibrated.gamma_policy.cost
    load = os.getloadavg()
    header = (f"GRPO-shaped workload — {len(base)} prompts × G={args.grpo_samples} at T=1 with the stop token, "
              f"{args.grpo_epochs} epochs (history kept), slots={args.grpo_slots}, "
              f"max_new_tokens={args.grpo_max_new_tokens}, gamma={gamma}, sampler={sampler}, "
              f"{args.grpo_repeats} repeats in lockstep; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"\n{header}", flush=True)
    for kind in kinds:  # warm-up, untimed: first-call costs (lazy init, allocator) on throwaway engines
        build_engine(models, kind, args.grpo_slots, max_seq, gamma, sampler).generate(
            base[:1], SamplingParams(max_new_tokens=4, seed=0))
    per_repeat: dict[str, list[Tally]] = {k: [] for k in kinds}
    for rep in range(args.grpo_repeats):
        engines = {k: build_engine(models, k, args.grpo_slots, max_seq, gamma, sampler) for k in kinds}
        params = [SamplingParams(max_new_tokens=args.grpo_max_new_tokens, temperature=1.0,
                                 stop_token_ids=models.stop_token_ids, seed=1000 * rep + epoch)
                  for epoch in range(args.grpo_epochs)]
        for name, tally in race_repeat(engines, prompts, params, cost).items():
            per_repeat[name].append(tally)
        print(f"  repeat {rep + 1}: " + ", ".join(f"{k}={t[-1].tokens / t[-1].seconds:.0f} tok/s"
                                                  for k, t in per_repeat.items()), flush=True)
    result = {"header": header, "contenders": summarize(per_repeat)}
    print_table(result)
    return result


def summarize(per_repeat: dict[str, list[Tally]]) -> dict[str, dict]:
    rates = {k: [t.tokens / t.seconds for t in ts] for k, ts in per_repeat.items()}
    out = {}
    for name, tallies in per_repeat.items():
        tokens, seconds = sum(t.tokens for t in tallies), sum(t.seconds for t in tallies)
        shares: dict[str, dict] = {}
        for t in tallies:
            for kind, d in t.by_drafter.items():
                share = shares.setdefault(kind, {"proposals": 0, "drafted": 0, "accepted": 0})
                for key in share:
                    share[key] += d[key]
        for share in shares.values():
            share["acceptance_rate"] = share["accepted"] / share["drafted"] if share["drafted"] else 0.0
            share["mean_accepted_len"] = 1 + share["accepted"] / share["proposals"] if share["proposals"] else 1.0
            share["token_share"] = share["accepted"] / tokens if tokens else 0.0
        entry = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                 "ceiling_tokens_per_s": tokens / sum(t.ceiling_seconds for t in tallies),
                 "tokens_per_step": tokens / sum(t.steps for t in tallies),
                 "per_repeat_tokens_per_s": rates[name], "by_drafter": shares}
        # the drafter LM's column: the full-vocabulary one, else the one over a draft vocabulary (head_bench's +dv)
        model = "model" if "model" in rates else "model+dv"
        for key, base in (("plain", "plain"), ("model", model)):
            if base in rates and base != name:
                entry[f"vs_{key}"] = paired_ratio(rates[name], rates[base])
        out[name] = entry
    return out


def _ratio(r: dict | None) -> str:
    if r is None:
        return "—"
    return f"{r['mean']:.2f}× [{r['lo']:.2f}, {r['hi']:.2f}]"


def print_table(result: dict) -> None:
    print("| contender | tokens/s | × plain [95% CI] | × model [95% CI] | tokens/step | per drafter: "
          "acceptance, mean accepted len, share of tokens | ceiling tokens/s (% reached) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in result["contenders"].items():
        shares = "; ".join(f"{kind} {s['acceptance_rate']:.2f}, {s['mean_accepted_len']:.2f}, "
                           f"{100 * s['token_share']:.0f}%" for kind, s in r["by_drafter"].items()) or "—"
        reached = 100 * r["tokens_per_s"] / r["ceiling_tokens_per_s"]
        print(f"| {name} | {r['tokens_per_s']:.0f} | {_ratio(r.get('vs_plain'))} | {_ratio(r.get('vs_model'))} | "
              f"{r['tokens_per_step']:.2f} | {shares} | {r['ceiling_tokens_per_s']:.0f} ({reached:.0f}%) |")
