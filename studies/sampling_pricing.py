"""Does pricing the sampling of verified positions pay? A config's engine with auto-γ, interleaved against the
same engine with that part of its cost model left out (`CostModel.sampling = None`, as before it was measured) and
against plain decoding: one target, the same prompts and seeds per round, the order reversed every other round.

    python studies/sampling_pricing.py --config configs/demo.yaml --rounds 4

Prints tokens/s per round and contender, and the paired ratios (docs/benchmarks.md, Run 7).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from specroll.bench.models import load_config_world
from specroll.integrations.model_source import load_drafter
from specroll.rollout import SamplingParams, SpecEngine


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml", help="a `specroll train` config (its engine)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per round, each sampled num_generations times")
    args = parser.parse_args(argv)
    try:
        world = load_config_world(args.config)
    except ValueError as err:
        parser.error(str(err))
    config, sources, target = world.config, world.sources, world.target
    torch.set_num_threads(config.torch_threads or torch.get_num_threads())
    engines = {name: SpecEngine(target, load_drafter(sources.paths, config.engine, target), config.engine)
               for name in ("priced", "unpriced")}
    engines["unpriced"].gamma_policy.cost.sampling = None
    engines["plain"] = SpecEngine(target, None, dataclasses.replace(config.engine, gamma=0, draft_vocab=None))
    params = SamplingParams(max_new_tokens=config.grpo.max_completion_length, temperature=config.grpo.temperature,
                            stop_token_ids=(sources.tokenizer.eos_token_id,), seed=7)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for round_ in range(args.rounds):
        prompts = world.task_prompts(args.prompts, seed=100 + round_)
        for name in list(engines) if round_ % 2 == 0 else list(reversed(engines)):
            started = time.perf_counter()
            out = engines[name].generate(prompts, params, n=config.grpo.num_generations)
            tokens = sum(len(r.completion_ids) for r in out)
            rates[name].append(tokens / (time.perf_counter() - started))
            print(f"round {round_} {name}: {rates[name][-1]:.1f} tok/s ({tokens} tokens)", flush=True)
    for a, b in (("priced", "unpriced"), ("priced", "plain"), ("unpriced", "plain")):
        print(f"{a} / {b}:", " ".join(f"{x / y:.3f}" for x, y in zip(rates[a], rates[b])))
    return rates


if __name__ == "__main__":
    main()
