"""KV memory and speed of the paged cache against the dense one (`EngineConfig.kv_cache`), on CPU.

    python studies/kv_memory.py [--skip-speed] [--repeats 4]

Memory: 64 slots at max_seq_len 8,192, 64 requests (8 prompts x 8 samples) with lognormal completion budgets
(median 96, sigma 1.35, as the long-tail workload; no stop token), plain decoding. Each cache runs in a fresh
child process; its peak RSS is the kernel's high-water mark (`VmHWM`, reset after construction), so a forward's
transients count; the paged run also counts the tokens its rows hold every step. Printed: peak RSS of each, the
paged run's growth over its RSS after construction against 1.3 x (peak tokens held x bytes per token) plus a
constant (the dense run's RSS beside its cache and weights, and its growth while decoding), and the dense cache's
size. The model is a random 2-layer Llama shaped so that its K/V is the point (2 K/V heads of 64 dims: 1 KiB per
token per layer in fp32).

Speed, plain and the drafter LM at γ = 3, dense and paged engines stepped in lockstep (the one with fewer tokens
steps next, each timed on its own steps), `--repeats` repeats after a warm-up; the paired ratio paged / dense of
tokens per second (mean, 95 % t-interval). `--models demo` (default): the demo's own shapes — `--config`'s target
and drafter (a 32,768-token vocabulary), its task's prompts × `num_generations`, its engine and sampling (T = 1,
invariant sampler: both caches emit the same tokens) — and a third pair, its engine as configured (auto-γ).
`--models synthetic`: random Llamas at the demo's widths with a 128-token vocabulary (16 prompts of 20-59 tokens,
16 slots, 48 new tokens, greedy), where the LM head costs nothing and the gather's share of a step is largest.
Timings on a shared machine are indicative only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from specroll.bench.engine_race import paired_ratio

SLOTS, MAX_SEQ_LEN, PROMPTS, SAMPLES, PROMPT_LEN = 64, 8192, 8, 8, 16
MEDIAN, SIGMA, SEED = 96, 1.35, 0
BLOCK_SIZE = 16
SPEED_NEW_TOKENS = 48


def lognormal_budgets(count: int, seed: int = SEED) -> list[int]:
    rng = random.Random(seed)
    cap = MAX_SEQ_LEN - PROMPT_LEN
    return [max(1, min(cap, round(MEDIAN * math.exp(SIGMA * rng.gauss(0, 1))))) for _ in range(count)]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> None:
    """Reset the kernel's high-water mark of this process's RSS (`VmHWM`) to its current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss() -> int:
    """The kernel's high-water mark of this process's RSS since the last `_reset_peak`: what a forward's
    transients (freed before the step returns) reach too, which a sample between steps would miss."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def memory_child(kind: str) -> dict:
    """One cache's run (in its own process): RSS after construction, peak RSS, peak tokens and blocks held."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

    torch.manual_seed(SEED)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                          max_position_embeddings=MAX_SEQ_LEN + 16)).eval()
    weights = sum(p.numel() * p.element_size() for p in target.parameters())
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=SLOTS, max_seq_len=MAX_SEQ_LEN, gamma=0,
                                                   kv_cache=kind, kv_block_size=BLOCK_SIZE))
    rng = random.Random(SEED)
    prompts = [[rng.randrange(3, 128) for _ in range(PROMPT_LEN)] for _ in range(PROMPTS)]
    prompts = [p for p in prompts for _ in range(SAMPLES)]  # siblings: the same tokens, each its own budget
    budgets = lognormal_budgets(len(prompts))
    per_token = engine.memory.target_kv // (engine.memory.kv_blocks * BLOCK_SIZE) if kind == "paged" else \
        engine.memory.target_kv // (SLOTS * engine.config.cache_len)
    base = _rss()
    _reset_peak()
    peak_rss, peak_tokens, peak_blocks, steps_run = base, 0, 0, 0
    cache = engine.target.cache
    started = time.perf_counter()
    steps = engine.generate_steps(prompts, SamplingParams(max_new_tokens=max(budgets), temperature=0),
                                  max_new_tokens=budgets)
    try:
        while True:
            live = next(steps)
            steps_run += 1
            peak_rss = max(peak_rss, _rss())
            peak_tokens = max(peak_tokens, sum(cache.host_lens[:live]))
            if kind == "paged":
                peak_blocks = max(peak_blocks, cache.capacity_blocks - len(cache.free))
    except StopIteration as done:
        generated = sum(len(r.completion_ids) for r in done.value)
    peak_rss = max(peak_rss, _peak_rss())
    return dict(kind=kind, weights=weights, per_token=per_token, base_rss=base, peak_rss=peak_rss,
                peak_tokens=peak_tokens, peak_blocks=peak_blocks, target_kv=engine.memory.target_kv, steps=steps_run,
                generated=generated, seconds=time.perf_counter() - started)


def run_memory() -> None:
    runs = {}
    for kind in ("dense", "paged"):
        out = subprocess.run([sys.executable, __file__, "--child", kind],
                             capture_output=True, text=True, check=True)
        runs[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    dense, paged = runs["dense"], runs["paged"]
    mib = 1 << 20
    held = paged["peak_tokens"] * paged["per_token"]
    growth = paged["peak_rss"] - paged["base_rss"]
    print(f"# KV memory: {SLOTS} slots, max_seq_len {MAX_SEQ_LEN}, {PROMPTS} prompts x {SAMPLES}, lognormal budgets "
          f""
          f"(median {MEDIAN}, sigma {SIGMA}, max {max(lognormal_budgets(PROMPTS * SAMPLES))}), plain, "
          f"block {BLOCK_SIZE} tokens")
    print(f"weights {paged['weights'] / mib:.1f} MiB; K/V {paged['per_token']} B per token; "
          f"dense cache {dense['target_kv'] / mib:.1f} MiB; {paged['generated']} tokens in {paged['steps']} steps")
    for run in (dense, paged):
        print(f"{run['kind']:>5}: RSS after construction {run['base_rss'] / mib:8.1f} MiB, "
              f"peak {run['peak_rss'] / mib:8.1f} MiB  ({run['seconds']:.1f} s)")
    print(f"paged: peak tokens held {paged['peak_tokens']} ({held / mib:.1f} MiB of K/V), peak blocks "
          f"{paged['peak_blocks']} ({paged['peak_blocks'] * BLOCK_SIZE * paged['per_token'] / mib:.1f} MiB); "
          f"RSS growth {growth / mib:.1f} MiB = {growth / max(held, 1):.2f} x the K/V held "
          "(bar: <= 1.3 plus a constant)")
    # The constant: what the dense run holds beside its cache and weights (the Python/torch runtime, row buffers)
    # after construction, plus its growth while decoding (a step's masks, logits and temporaries).
    constant = dense["base_rss"] - dense["target_kv"] - dense["weights"] + dense["peak_rss"] - dense["base_rss"]
    bound = paged["weights"] + 1.3 * held + constant
    print(f"bar: paged peak {paged['peak_rss'] / mib:.1f} MiB <= weights + 1.3 x K/V held + constant "
          f"({constant / mib:.1f} MiB: the dense run's RSS beside its cache and weights, and its growth) = "
          f"{bound / mib:.1f} MiB: {'pass' if paged['peak_rss'] <= bound else 'FAIL'}")
    print(f"peak RSS paged / dense: {paged['peak_rss'] / dense['peak_rss']:.3f}")


@dataclass
class SpeedWorld:
    """What the speed pairs run: models, prompts (each sampled `n` times), the engine settings and sampling."""

    target: object
    drafter: object
    prompts: list[list[int]]
    n: int
    base: object  # EngineConfig, kv_cache and gamma set per engine
    params: object  # SamplingParams
    description: str


def _synthetic_world() -> SpeedWorld:
    """The attention-heavy variant: random Llamas at the demo target's and drafter's widths with a 128-token
    vocabulary, so the LM head costs next to nothing and the gather's share of a step is the largest."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specroll.rollout import EngineConfig, SamplingParams

    def llama(hidden: int, layers: int, heads: int, inter: int, seed: int) -> LlamaForCausalLM:
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=inter,
                                            num_hidden_layers=layers, num_attention_heads=heads,
                                            num_key_value_heads=heads, max_position_embeddings=1024)).eval()

    target, drafter = llama(512, 8, 8, 2048, 0), llama(192, 2, 3, 768, 1)
    rng = random.Random(SEED)
    prompts = [[rng.randrange(3, 128) for _ in range(rng.randrange(20, 60))] for _ in range(16)]
    base = EngineConfig(max_batch_size=16, max_seq_len=256, kv_block_size=BLOCK_SIZE)
    params = SamplingParams(max_new_tokens=SPEED_NEW_TOKENS, temperature=0)
    return SpeedWorld(target, drafter, prompts, 1, base, params,
                      f"random Llamas 512 x 8 / 192 x 2, 128-token vocabulary, 16 prompts through 16 slots, "
                      f"{SPEED_NEW_TOKENS} new tokens, greedy")


def _demo_world(config_path: str, num_prompts: int) -> SpeedWorld:
    """The demo's own shapes: its target and drafter (`configs/demo.yaml`'s models, a 32,768-token vocabulary),
    its task's prompts, each sampled `num_generations` times, its engine settings and sampling."""
    import dataclasses

    from specroll.bench.models import load_config_world
    from specroll.integrations.model_source import load_drafter
    from specroll.rollout import SamplingParams

    world = load_config_world(config_path)
    config, sources, target = world.config, world.sources, world.target
    drafter = load_drafter(sources.paths, dataclasses.replace(config.engine, draft_vocab=None), target)
    prompts = world.task_prompts(num_prompts, seed=100)
    base = dataclasses.replace(config.engine, draft_vocab=None, kv_block_size=BLOCK_SIZE)
    params = SamplingParams(max_new_tokens=config.grpo.max_completion_length, temperature=config.grpo.temperature,
                            stop_token_ids=(sources.tokenizer.eos_token_id,), seed=7)
    n = config.grpo.num_generations
    return SpeedWorld(target, drafter, prompts, n, base, params,
                      f"{config_path}'s models (vocabulary {target.config.vocab_size}), {num_prompts} task prompts "
                      f"x {n} samples through {base.max_batch_size} slots, up to {params.max_new_tokens} new "
                      f"tokens, T = {params.temperature}, sampler {base.sampler}")


def run_speed(repeats: int, models: str, config_path: str, num_prompts: int) -> None:
    import dataclasses

    import torch

    from specroll.rollout import SpecEngine

    world = _demo_world(config_path, num_prompts) if models == "demo" else _synthetic_world()
    drafter, base, params = world.drafter, world.base, world.params
    print(f"# tokens/s, paged vs dense: {world.description}; {repeats} lockstep repeats; torch threads "
          f"{torch.get_num_threads()}; load {os.getloadavg()}")
    contenders = [("plain", None, 0), ("model γ=3", drafter, 3)]
    if models == "demo":
        contenders.append((f"γ={base.gamma}", drafter, base.gamma))  # the demo's own engine (auto-γ)
    for name, draft, gamma in contenders:
        engines = {kind: SpecEngine(world.target, draft, dataclasses.replace(base, gamma=gamma, kv_cache=kind))
                   for kind in ("dense", "paged")}
        rates: dict[str, list[float]] = {kind: [] for kind in engines}
        same = True
        for repeat in range(repeats + 1):  # the first repeat warms up
            tallies = _lockstep(engines, world.prompts, params, world.n)
            same = same and tallies["dense"][2] == tallies["paged"][2]
            if repeat:
                for kind, (tokens, seconds, _) in tallies.items():
                    rates[kind].append(tokens / seconds)
        if params.temperature == 0:
            assert same, "paged and dense disagree"
        ratio = paired_ratio(rates["paged"], rates["dense"])
        print(f"{name:>10}: dense {statistics.median(rates['dense']):7.0f} tok/s, paged "
              f"{statistics.median(rates['paged']):7.0f} tok/s; paged/dense per repeat "
              f"{' '.join(f'{p / d:.3f}' for p, d in zip(rates['paged'], rates['dense']))}; mean "
              f"{ratio['mean']:.3f} [{ratio['lo']:.3f}, {ratio['hi']:.3f}]; same tokens: {same}", flush=True)


def _lockstep(engines: dict, prompts: list[list[int]], params, n: int) -> dict[str, tuple[int, float, list]]:
    """One generation per engine, stepped in turn (always the one with the fewest tokens so far steps next), each
    timed on its own steps, so a slow spell of the machine hits both caches alike: kind -> (tokens, seconds,
    completions)."""
    running = {kind: engine.generate_steps(prompts, params, n=n) for kind, engine in engines.items()}
    seconds = dict.fromkeys(engines, 0.0)
    out = {}
    while running:
        kind = min(running, key=lambda k: engines[k].stats.generated_tokens)
        started = time.perf_counter()
        try:
            next(running[kind])
            seconds[kind] += time.perf_counter() - started
        except StopIteration as done:
            seconds[kind] += time.perf_counter() - started
            completions = [r.completion_ids for r in done.value]
            out[kind] = (sum(map(len, completions)), seconds[kind], completions)
            del running[kind]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", choices=["dense", "paged"], help=argparse.SUPPRESS)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--models", choices=["demo", "synthetic"], default="demo",
                        help="speed: the demo's models and task (default) or random 128-vocabulary Llamas")
    parser.add_argument("--config", default="configs/demo.yaml", help="with --models demo: the train config")
    parser.add_argument("--prompts", type=int, default=4, help="with --models demo: task prompts")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(memory_child(args.child)))
        return
    if not args.skip_memory:
        run_memory()
    if not args.skip_speed:
        run_speed(args.repeats, args.models, args.config, args.prompts)


if __name__ == "__main__":
    main()
