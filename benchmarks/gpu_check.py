"""`python -m specroll.benchmarks.gpu_check`: the engine's first run on a GPU, in one script.

Builds a random-init Qwen2 pair from configs (no downloads, `shapes.SHAPES`): a ~0.5B target (Qwen2.5-0.5B's
shape) and a ~50M-class drafter over the same vocabulary, then

1. greedy exactness in fp32: plain decoding vs the model drafter, the suffix drafter and both
   (`EngineConfig.drafters`), token for token, two calls (the second drafts from the first's history);
2. a bf16 check: greedy speculative decoding in bf16, where each emitted token's target logit (from
   one full bf16 forward over prompt + completion) must lie within `--bf16-tol` of that position's
   max (bf16 rounding may flip near-ties; anything more is a bug);
3. the grid at b = 1 / 16 / 64 rows (b/8 prompts × 8 samples, or b samples of one prompt, two epochs
   so the suffix drafter has history), plain / model / suffix / suffix+model in lockstep, printing one
   table of tokens/s and × plain.

Random weights make the drafter a poor one and greedy text repetitive (which the suffix drafter
likes), so the grid checks speed mechanics, not the speed-ups of trained models. `--tiny` shrinks
everything to seconds on a CPU (the default test suite runs it so). Exit code 1 if a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

from .grpo_bench import DRAFTERS, race_repeat
from .shapes import build


def prompts_for(rows: int, vocab: int, seed: int, length: int = 16) -> list[list[int]]:
    """`rows` prompts as GRPO sends them: up to 8 samples of each prompt, consecutive."""
    gen = torch.Generator().manual_seed(seed)
    samples = min(rows, 8)
    base = [torch.randint(vocab, (length,), generator=gen).tolist() for _ in range(max(rows // samples, 1))]
    return [p for p in base for _ in range(samples)]


def engine(target, drafter, kind: str, rows: int, max_seq: int, gamma: int | str, args, dtype) -> SpecEngine:
    drafters = DRAFTERS[kind]
    config = EngineConfig(max_batch_size=rows, max_seq_len=max_seq, gamma=0 if drafters is None else gamma,
                          drafters=drafters, device=args.device, dtype=dtype, stats_trace_steps=1,
                          cost_model_budget_s=args.calibration_budget, calibration_cache=args.calibration_cache)
    return SpecEngine(target, drafter if drafters and "model" in drafters else None, config)


def check_exact(target, drafter, args) -> bool:
    prompts = prompts_for(8, target.config.vocab_size, seed=1)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
    max_seq = 16 + args.max_new_tokens + 1
    reference = [r.completion_ids for r in
                 engine(target, drafter, "plain", 8, max_seq, 0, args, torch.float32).generate(prompts, params)]
    ok = True
    for kind in ("model", "suffix", "suffix+model"):
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
    return ok


def grid(target, drafter, args) -> list[dict]:
    kinds = list(DRAFTERS)
    rows_out = []
    print("\n| b | " + " | ".join(f"{k} tok/s (× plain)" for k in kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for rows in (int(b) for b in args.batch_sizes.split(",")):
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
    args = parser.parse_args(argv)
    args.gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    started = time.perf_counter()
    prefix = "tiny_" if args.tiny else ""
    target, drafter = build(f"{prefix}target", 0), build(f"{prefix}drafter", 1)
    cuda = args.device.startswith("cuda")
    name = torch.cuda.get_device_name(args.device) if cuda else f"cpu ({os.cpu_count()} cores)"
    load = os.getloadavg()
    print(f"gpu_check on {name}; target {sum(p.numel() for p in target.parameters()) / 1e6:.0f}M, drafter "
          f"{sum(p.numel() for p in drafter.parameters()) / 1e6:.0f}M params (random init); "
          f"load average {load[0]:.2f}", flush=True)
    ok = check_exact(target, drafter, args)
    ok &= check_bf16(target, drafter, args)
    grid(target, drafter, args)
    print(f"\n{'all checks passed' if ok else 'CHECKS FAILED'} in {time.perf_counter() - started:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
