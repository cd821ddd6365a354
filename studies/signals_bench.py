"""Overhead of recording learning signals: `generate` with `record_signals` on vs off, interleaved.

Signals (the target's top-k processed probabilities, the drafted token and whether it was kept, at
every completion position) feed the online drafter; the bar (issue 5) is ≤ 5% of rollout time.
Both engines share the same target, drafter, prompts, sampling and seed, so they emit the same
tokens and do the same model work: the ratio is the recording's cost alone. Repeats alternate
which engine runs first so machine noise hits both alike.

    python studies/signals_bench.py --models demo --batch 16 --gamma 4
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from specroll.bench.models import BenchModels, load_bench_models
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine


@dataclass
class SignalOverhead:
    """Seconds summed over repeats; `ratio` = on / off (1.05 = 5% overhead)."""

    seconds_on: float
    seconds_off: float
    tokens: int  # generated per repeat (identical for both engines)
    repeats: int

    @property
    def ratio(self) -> float:
        return self.seconds_on / self.seconds_off


def measure_signal_overhead(models: BenchModels, batch: int, gamma: int, params: SamplingParams, top_k: int,
                            repeats: int) -> SignalOverhead:
    """Time `generate` on `batch` prompts with signals recorded vs not; interleaved, after a warm-up."""
    prompts = [models.prompts[i % len(models.prompts)] for i in range(batch)]
    max_seq = max(map(len, prompts)) + params.max_new_tokens + 1

    def engine(record: bool) -> SpecEngine:
        config = EngineConfig(max_batch_size=batch, max_seq_len=max_seq, gamma=gamma, record_signals=record,
                              signal_top_k=top_k)
        return SpecEngine(models.target, models.drafter, config)

    engines = {True: engine(True), False: engine(False)}
    for e in engines.values():
        e.generate(prompts[:1], SamplingParams(max_new_tokens=4, temperature=params.temperature, seed=0))
    seconds, tokens = {True: 0.0, False: 0.0}, {}
    for rep in range(repeats):
        for record in ((True, False) if rep % 2 == 0 else (False, True)):
            started = time.perf_counter()
            rollouts = engines[record].generate(prompts, params)
            seconds[record] += time.perf_counter() - started
            tokens[record] = sum(len(r.completion_ids) for r in rollouts)
    if tokens[True] != tokens[False]:
        raise RuntimeError(f"recording changed the rollouts: {tokens[True]} vs {tokens[False]} tokens")
    return SignalOverhead(seconds[True], seconds[False], tokens[True], repeats)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="demo", choices=["demo", "tiny"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    models = load_bench_models(args.models, num_prompts=args.batch)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            stop_token_ids=models.stop_token_ids, seed=0)
    print(f"signals bench — {models.description}; batch={args.batch}, γ={args.gamma}, "
          f"T={args.temperature}, max_new_tokens={args.max_new_tokens}, top_k={args.top_k}, "
          f"repeats={args.repeats} interleaved, torch threads={torch.get_num_threads()}, fp32 CPU", flush=True)
    result = measure_signal_overhead(models, args.batch, args.gamma, params, args.top_k, args.repeats)
    print(f"tokens/repeat={result.tokens}  record on {result.seconds_on:.2f}s  off {result.seconds_off:.2f}s  "
          f"on/off = {result.ratio:.3f} (overhead {100 * (result.ratio - 1):+.1f}%; bar ≤ +5%)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
