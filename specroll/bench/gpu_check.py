"""`python -m specroll.bench.gpu_check`: the engine's first run on a GPU, in one script.

Builds a random-init Qwen2 pair from configs (no downloads, `shapes.SHAPES`): a ~0.5B target (Qwen2.5-0.5B's
shape) and a ~50M-class drafter over the same vocabulary, then

1. greedy exactness in fp32: plain decoding vs the model drafter, the suffix drafter, both
   (`EngineConfig.drafters`), and fresh EAGLE, EAGLE-3 and block heads, token for token, two calls (the second
   drafts from the first's history);
2. a bf16 check: greedy speculative decoding in bf16, where each emitted token's target logit (from
   one full bf16 forward over prompt + completion) must lie within `--bf16-tol` of that position's
   max (bf16 rounding may flip near-ties; anything more is a bug); and the engine's bf16 cast must
   have left every rotary `inv_freq` buffer (target and drafter) in fp32;
3. the sync cell: the 0.5B-shaped pair in bf16 at b = `--cell-rows` (64), γ auto, per drafter kind (plain,
   model, suffix, suffix + model, a fresh EAGLE head): tokens/s, mean γ and host↔device syncs per step over a
   whole `generate` (admission, prefill and export included) and over steady-state steps (every row live,
   through `generate_steps`), counted by torch's sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`:
   one warning per synchronizing CUDA call; not counted on a CPU); `--sync-sites` prints where the steady
   ones come from (`sync_site`);
4. the grid at b = 1 / 16 / 64 rows (b/8 prompts × 8 samples, or b samples of one prompt, two epochs
   so the suffix drafter has history), plain / model / suffix / suffix+model in lockstep, printing one
   table of tokens/s and × plain.

Random weights make the drafter a poor one and greedy text repetitive (which the suffix drafter
likes), so the grid checks speed mechanics, not the speed-ups of trained models. `--tiny` shrinks
everything to seconds on a CPU (the default test suite runs it so). A stage that would start past
`--budget-s` (8 minutes) less a minute is skipped, and says so; `--stages` runs a subset. Exit code 1 if a
check fails.

It imports only torch, transformers and the standard library, and runs on torch >= 2.11 and
transformers >= 5.17 as well as the project's pins: `specroll/bench/gpu_check_install.sh` runs it on a
machine without network, with the torch and transformers it has.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch
import transformers
from torch.nn.attention import SDPBackend

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads import EagleHead
from specroll.rollout.models import attention

from .grpo_bench import DRAFTERS, race_repeat
from .shapes import build
from .sync_count import SYNC_WARNING, count_sync_warnings, count_syncs, sync_site  # noqa: F401  (gpu_check's API)

TORCH_SDPA_ORDER = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.MATH]  # every kernel allowed: torch's own choice among them
BUDGET_RESERVE_S = 60.0  # a stage starting later than this before the budget's end is skipped


def prompts_for(rows: int, vocab: int, seed: int, length: int = 16) -> list[list[int]]:
    """`rows` prompts as GRPO sends them: up to 8 samples of each prompt, consecutive."""
    gen = torch.Generator().manual_seed(seed)
    samples = min(rows, 8)
    base = [torch.randint(vocab, (length,), generator=gen).tolist() for _ in range(max(rows // samples, 1))]
    return [p for p in base for _ in range(samples)]


# fresh heads on the target's features: EAGLE-1-like, EAGLE-3, block, ReDrafter
HEAD_KINDS = ("eagle", "eagle3", "block", "recurrent")


def engine(target, drafter, kind: str, rows: int, max_seq: int, gamma: int | str, args, dtype) -> SpecEngine:
    """An engine of drafter `kind`: one of `DRAFTERS`, or one of `HEAD_KINDS` (a fresh head, random init)."""
    drafters = (kind,) if kind in HEAD_KINDS else DRAFTERS.get(kind)
    speculates = kind != "plain"
    config = EngineConfig(max_batch_size=rows, max_seq_len=max_seq, gamma=gamma if speculates else 0,
                          drafters=drafters, device=args.device, dtype=dtype, stats_trace_steps=1,
                          cost_model_budget_s=args.calibration_budget, calibration_cache=args.calibration_cache)
    if kind == "eagle":
        return SpecEngine(target, EagleHead.for_target(target.config, seed=3), config)
    if kind in HEAD_KINDS:  # the engine makes a fresh head of the kind
        return SpecEngine(target, None, config)
    return SpecEngine(target, drafter if drafters and "model" in drafters else None, config)


def check_exact(target, drafter, args) -> bool:
    prompts = prompts_for(8, target.config.vocab_size, seed=1)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
    max_seq = 16 + args.max_new_tokens + 1
    reference = [r.completion_ids for r in
                 engine(target, drafter, "plain", 8, max_seq, 0, args, torch.float32).generate(prompts, params)]
    ok = True
    for kind in ("model", "suffix", "suffix+model", *HEAD_KINDS):
        spec = engine(target, drafter, kind, 8, max_seq, 4, args, torch.float32)
        same = all([r.completion_ids for r in spec.generate(prompts, params)] == reference for _ in range(2))
        print(f"greedy fp32 exactness, {kind}: {'ok' if same else 'MISMATCH'} "
              f"(acceptance {spec.stats.acceptance_rate:.2f})", flush=True)
        ok &= same
    return ok


@torch.inference_mode()
def check_bf16(target, drafter, args) -> bool:
    prompts = prompts_for(8, target.config.vocab_size, seed=2)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
    spec = engine(target, drafter, "suffix+model", 8, 16 + args.max_new_tokens + 1, 4, args, torch.bfloat16)
    worst = 0.0
    for r in spec.generate(prompts, params):
        ids = torch.tensor([r.prompt_ids + r.completion_ids], device=args.device)
        logits = spec.target.model(input_ids=ids).logits[0, len(r.prompt_ids) - 1 : -1].float()  # [T, V]
        emitted = logits.gather(-1, ids[0, len(r.prompt_ids):, None]).squeeze(-1)  # [T]
        worst = max(worst, float((logits.max(-1).values - emitted).max()))
    ok = worst <= args.bf16_tol
    print(f"bf16 greedy: worst emitted-token logit below the position's max {worst:.4f} "
          f"({'ok' if ok else 'FAIL'}, tolerance {args.bf16_tol})", flush=True)
    return check_fp32_rotary({"target": spec.target.model, "drafter": drafter}) and ok


def check_fp32_rotary(modules: dict[str, torch.nn.Module]) -> bool:
    """Every `inv_freq` buffer of `modules` (after the engine's cast) is fp32; prints what it found."""
    found = {f"{role}.{name}": buffer.dtype for role, module in modules.items()
             for name, buffer in module.named_buffers() if name.endswith("inv_freq")}
    wrong = {name: dtype for name, dtype in found.items() if dtype != torch.float32}
    print(f"fp32 rotary after the bf16 cast: {'ok' if found and not wrong else 'FAIL'} "
          f"({len(found)} inv_freq buffers{', not fp32: ' + str(wrong) if wrong else ''})", flush=True)
    return bool(found) and not wrong


SYNC_KINDS = (*DRAFTERS, "eagle")  # the bar: plain, model, EAGLE and suffix + model
# With max_gamma 8 the counted steps emit ≤ 135 of 256 tokens: no row ends.
WARM_STEPS, COUNTED_STEPS, PROFILED_STEPS = 3, 12, 16


def sync_cell(target, drafter, args) -> list[dict]:
    """The bf16 cell at b = `args.cell_rows`, γ auto: per drafter kind, tokens/s of a whole `generate` and host↔device
    syncs per step, over that call and over steady-state steps (every row live, counted through `generate_steps`
    after `WARM_STEPS`); with `--sync-sites`, where the steady-state syncs come from."""
    rows = args.cell_rows
    prompts = prompts_for(rows, target.config.vocab_size, seed=4)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
    steady = SamplingParams(max_new_tokens=256, temperature=0)
    print(f"\nsync cell: bf16, b = {rows}, γ auto (syncs: torch.cuda.set_sync_debug_mode('warn'); steady: "
          f"{COUNTED_STEPS} steps with every row live, after {WARM_STEPS})")
    print("| kind | tok/s | mean γ | syncs / step, whole call | syncs / step, steady |\n|---|---|---|---|---|")
    cells, where = [], {}
    for kind in SYNC_KINDS:
        spec = engine(target, drafter, kind, rows, 16 + 256 + 1, "auto", args, torch.bfloat16)
        spec.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0))  # warm-up and calibration
        before = spec.stats.totals()
        started = time.perf_counter()
        spec.generate(prompts, params)
        seconds = time.perf_counter() - started
        stats = spec.stats.since(before)
        whole = count_syncs(lambda spec=spec: spec.generate(prompts, params), args.device)
        where[kind] = collections.Counter()
        steps = spec.generate_steps(prompts, steady)
        for _ in range(WARM_STEPS):
            next(steps)
        live = []
        counted = count_syncs(lambda live=live, steps=steps: live.extend(next(steps) for _ in range(COUNTED_STEPS)),
                              args.device,
                              where[kind] if args.sync_sites else None)
        steps.close()
        if live != [rows] * COUNTED_STEPS:
            raise RuntimeError(f"the sync cell's counted steps were not all at full batch: {live}")
        per_call = "n/a (cpu)" if whole is None else f"{whole / max(stats.steps, 1):.2f}"
        per_step = "n/a (cpu)" if counted is None else f"{counted / COUNTED_STEPS:.2f}"
        print(f"| {kind} | {stats.generated_tokens / seconds:.0f} | {stats.mean_gamma:.2f} | {per_call} | "
              f"{per_step} |", flush=True)
        cells.append({"kind": kind, "syncs": whole, "steps": stats.steps, "steady_syncs": counted})
    for kind, sites in where.items():
        if sites:
            print(f"\nsteady-state sync sites, {kind} (count over {COUNTED_STEPS} steps: the call that synced < "
                  "specroll's frames, innermost first)")
            for site, count in sites.most_common(12):
                print(f"  {count:4d}  {site}")
    return cells


def grid(target, drafter, args) -> list[dict]:
    kinds = list(DRAFTERS)
    rows_out = []
    print("\n| b | " + " | ".join(f"{k} tok/s (× plain)" for k in kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for rows in (int(b) for b in args.batch_sizes.split(",")):
        if not within_budget(args, f"grid row b = {rows}"):
            continue
        prompts = prompts_for(rows, target.config.vocab_size, seed=3)
        max_seq = 16 + args.max_new_tokens + 1
        engines = {k: engine(target, drafter, k, rows, max_seq, args.gamma, args, torch.bfloat16)
                   for k in kinds}
        for e in engines.values():  # warm-up (and the auto-γ calibration), untimed
            e.generate(prompts[:1], SamplingParams(max_new_tokens=4, temperature=0))
        engines = {k: engine(target, drafter, k, rows, max_seq, args.gamma, args, torch.bfloat16)
                   for k in kinds}
        params = [SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=epoch)
                  for epoch in range(2)]
        cost = next((e.gamma_policy.cost for e in engines.values() if hasattr(e.gamma_policy, "cost")), None)
        tallies = race_repeat(engines, prompts, params, cost) if cost else None
        if tallies is None:
            raise ValueError("gamma must be 'auto' for the grid (its ceiling needs the calibrated cost model)")
        rates = {k: t.tokens / t.seconds for k, t in tallies.items()}
        print(f"| {rows} | " + " | ".join(f"{rates[k]:.0f} ({rates[k] / rates['plain']:.2f}×)" for k in kinds) + " |",
              flush=True)
        rows_out.append({"batch": rows, "tokens_per_s": rates})
    return rows_out


def profile_step(target, drafter, args) -> None:
    """Where a plain decode step's time goes at `--profile-rows` live rows in bf16: torch's profiler over
    `PROFILED_STEPS` steady steps (after `WARM_STEPS`), the ops by their own host time and the device's busy time."""
    rows = args.profile_rows
    spec = engine(target, drafter, "plain", rows, 16 + 256 + 1, 0, args, torch.bfloat16)
    steps = spec.generate_steps(prompts_for(rows, target.config.vocab_size, seed=5),
                                SamplingParams(max_new_tokens=256, temperature=0))
    for _ in range(WARM_STEPS):
        next(steps)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            next(steps)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    steps.close()
    events = prof.key_averages()
    device_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events)
    ops = sum(e.count for e in events) // PROFILED_STEPS
    print(f"\nplain step profile, bf16, b = {rows}: {1e3 * seconds / PROFILED_STEPS:.1f} ms a step under the "
          f"profiler; device busy {device_us / 1e3 / PROFILED_STEPS:.1f} ms a step; {ops} profiled ops a step",
          flush=True)
    kernels = {e.key: e.count // PROFILED_STEPS for e in events
               if any(word in e.key.lower() for word in ("cudnn_attention", "flash_attention", "efficient_attention",
                                                         "scaled_dot_product_attention_math"))}
    print(f"attention kernels a step (--sdpa {args.sdpa}): {kernels or 'none seen'}", flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60), flush=True)


def sdpa_ab(target, drafter, args) -> list[dict]:
    """Plain decoding in bf16 with the engine's CUDA attention backends (`attention.CUDA_SDPA_BACKENDS`: no cuDNN)
    against torch's own choice (all backends allowed: cuDNN was its pick on the H200), two engines stepped
    alternately (paired), per batch size:
    tokens/s and the ratio. The backends are swapped around each step of each engine."""
    chosen = attention.CUDA_SDPA_BACKENDS
    torch_order = TORCH_SDPA_ORDER
    print("\nSDPA backends, plain bf16, stepped alternately: no cuDNN (the engine's) vs torch's choice (all allowed)")
    print("| b | no cuDNN tok/s | torch's choice tok/s | no cuDNN ÷ torch's |\n|---|---|---|---|")
    out = []
    try:
        for rows in (int(b) for b in args.batch_sizes.split(",")):
            if not within_budget(args, f"sdpa row b = {rows}"):
                continue
            prompts = prompts_for(rows, target.config.vocab_size, seed=6)
            params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
            sides = {name: (backends, engine(target, drafter, "plain", rows, 16 + args.max_new_tokens + 1, 0, args,
                                             torch.bfloat16)) for name, backends in (("engine", chosen),
                                                                                     ("torch", torch_order))}
            seconds = dict.fromkeys(sides, 0.0)
            for warm in (True, False):
                running = {name: spec.generate_steps(prompts, params) for name, (_, spec) in sides.items()}
                while running:
                    for name in list(running):
                        attention.CUDA_SDPA_BACKENDS = sides[name][0]
                        started = time.perf_counter()
                        try:
                            next(running[name])
                        except StopIteration:
                            del running[name]
                        if args.device.startswith("cuda"):
                            torch.cuda.synchronize()
                        seconds[name] += 0.0 if warm else time.perf_counter() - started
            tokens = rows * args.max_new_tokens
            rate = {name: tokens / seconds[name] for name in sides}
            print(f"| {rows} | {rate['engine']:.0f} | {rate['torch']:.0f} | {rate['engine'] / rate['torch']:.2f}× |",
                  flush=True)
            out.append({"batch": rows, **rate})
    finally:
        attention.CUDA_SDPA_BACKENDS = chosen
    return out


def within_budget(args, stage: str) -> bool:
    """False (and says so) when `stage` would start less than `BUDGET_RESERVE_S` before `--budget-s` ends."""
    elapsed = time.perf_counter() - args.started
    if elapsed <= args.budget_s - BUDGET_RESERVE_S:
        return True
    print(f"{stage}: skipped ({elapsed:.0f}s of the {args.budget_s:.0f}s budget spent)", flush=True)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny models and settings (a CPU smoke run)")
    parser.add_argument("--batch-sizes", default="1,16,64")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", default="auto")
    parser.add_argument("--temperature", type=float, default=0.0, help="of the grid (checks are greedy)")
    parser.add_argument("--bf16-tol", type=float, default=0.05)
    parser.add_argument("--calibration-budget", type=float, default=8.0, help="auto-γ calibration seconds per engine")
    parser.add_argument("--calibration-cache", default=None, help="folder of the calibration cache (default ~/.cache)")
    parser.add_argument("--cell-rows", type=int, default=64, help="rows of the sync cell")
    parser.add_argument("--sync-sites", action="store_true", help="print where the sync cell's steady syncs come from")
    parser.add_argument("--stages", default="exact,bf16,sync,grid",
                        help="which of exact,bf16,sync,grid,profile,sdpa to run (profile, sdpa: not by default)")
    parser.add_argument("--profile-rows", type=int, default=1, help="live rows of the profiled plain steps")
    parser.add_argument("--budget-s", type=float, default=480.0, help="stages that would start past it are skipped")
    parser.add_argument("--sdpa", choices=("engine", "torch"), default="engine",
                        help="CUDA attention kernels of every stage: the engine's (no cuDNN) or torch's own choice")
    args = parser.parse_args(argv)
    if args.sdpa == "torch":
        attention.CUDA_SDPA_BACKENDS = TORCH_SDPA_ORDER
    args.gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    started = args.started = time.perf_counter()
    prefix = "tiny_" if args.tiny else ""
    target, drafter = build(f"{prefix}target", 0), build(f"{prefix}drafter", 1)
    cuda = args.device.startswith("cuda")
    name = torch.cuda.get_device_name(args.device) if cuda else f"cpu ({os.cpu_count()} cores)"
    load = os.getloadavg()
    print(f"gpu_check on {name}; target {sum(p.numel() for p in target.parameters()) / 1e6:.0f}M, drafter "
          f"{sum(p.numel() for p in drafter.parameters()) / 1e6:.0f}M params (random init); "
          f"load average {load[0]:.2f}; torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    stages = set(args.stages.split(","))
    ok = check_exact(target, drafter, args) if "exact" in stages else True
    ok &= check_bf16(target, drafter, args) if "bf16" in stages else True
    if "sync" in stages and within_budget(args, "sync cell"):
        sync_cell(target, drafter, args)
    if "grid" in stages:
        grid(target, drafter, args)
    if "sdpa" in stages:
        sdpa_ab(target, drafter, args)
    if "profile" in stages and within_budget(args, "profile"):
        profile_step(target, drafter, args)
    print(f"\n{'all checks passed' if ok else 'CHECKS FAILED'} in {time.perf_counter() - started:.0f}s "
          f"(budget {args.budget_s:.0f}s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
