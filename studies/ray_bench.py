"""Ray backend benchmark: worker scaling, Ray-path overhead, and weight-sync time per transport.

    python studies/ray_bench.py [--rounds 3] [--sync-params-m 50]

Setting (printed in the header): tiny random Llama target/drafter built here (no downloads), one CPU
thread per engine, a workload of 4 prompt groups × n samples. Runs interleave, round by round:
(a) the engine called directly in this process, (b) the Ray path with 1 worker, (c) with 2 workers —
same prompts, params and seeds. Prints ratios: 2 workers / 1 worker tokens/s, and the Ray path's
overhead over the direct engine. Then syncs a model of ~`--sync-params-m` M parameters to one worker
through the object store and through a gloo broadcast group and prints seconds for each.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import ray
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from specroll.integrations.model_source import ModelPaths
from specroll.integrations.ray_backend.cluster import connect_ray
from specroll.integrations.ray_backend.controller import RolloutController
from specroll.integrations.ray_backend.settings import ActorResources, ControllerConfig, SyncConfig, TopologyConfig
from specroll.integrations.ray_backend.sync.broadcast import TorchBroadcastTransport
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt group")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sync-params-m", type=float, default=50.0, help="model size for the sync test (M params)")


def llama(hidden: int, layers: int, vocab: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=int(2.7 * hidden), num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=512, tie_word_embeddings=False)).eval()


def controller_for(paths: ModelPaths, workers: int, engine: EngineConfig) -> RolloutController:
    return RolloutController(ControllerConfig(
        models=paths, engine=engine, sync=SyncConfig(bucket_mb=64, timeout_s=120),
        topology=TopologyConfig(num_workers=workers, worker=ActorResources(num_cpus=1), placement_strategy=None)))


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="specroll_ray_bench_")
    paths = ModelPaths(f"{root}/target", f"{root}/drafter")
    llama(256, 4, 512, seed=0).save_pretrained(paths.target)
    llama(64, 1, 512, seed=1).save_pretrained(paths.drafter)
    engine_config = EngineConfig(max_batch_size=16, max_seq_len=256, gamma=2)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
    prompts = [[(13 * g + j) % 512 for j in range(16)] for g in range(4)]
    # Logical CPUs: three controllers' workers (1 + 2, one torch thread each) must all be placed at once.
    connect_ray(None, num_cpus=max(4, os.cpu_count()))  # embedded, loopback only
    print(f"# ray_bench: {os.cpu_count()} CPUs, target 4x256 (vocab 512), drafter 1x64, 4 groups x n={args.n}, "
          f"{args.max_new_tokens} new tokens, gamma=2, T=1, {args.rounds} interleaved rounds")
    direct = SpecEngine(AutoModelForCausalLM.from_pretrained(paths.target),
                        AutoModelForCausalLM.from_pretrained(paths.drafter), engine_config)
    one, two = controller_for(paths, 1, engine_config), controller_for(paths, 2, engine_config)
    timings = {"direct": [], "ray_1": [], "ray_2": []}
    tokens = {}
    for warm_up in (direct.generate, one.generate, two.generate):
        warm_up(prompts, params, args.n)
    for _ in range(args.rounds):
        for name, fn in (("direct", direct.generate), ("ray_1", one.generate), ("ray_2", two.generate)):
            started = time.perf_counter()
            rollouts = fn(prompts, params, args.n)
            timings[name].append(time.perf_counter() - started)
            tokens[name] = sum(len(r.completion_ids) for r in rollouts)
    tps = {name: tokens[name] * len(t) / sum(t) for name, t in timings.items()}
    print("| path | tokens/s |\n|---|---|")
    for name, value in tps.items():
        print(f"| {name} | {value:.1f} |")
    print(f"2 workers / 1 worker tokens/s: {tps['ray_2'] / tps['ray_1']:.2f}x")
    print(f"Ray path (1 worker) overhead vs direct engine: {100 * (tps['direct'] / tps['ray_1'] - 1):+.1f}%")
    one.shutdown()
    two.shutdown()
    sync_benchmark(args, root)
    ray.shutdown()
    return 0


def sync_benchmark(args: argparse.Namespace, root: str) -> None:
    hidden, vocab = 512, 32000
    layers = max(1, round((args.sync_params_m * 1e6 - 2 * vocab * hidden) / (12.1 * hidden * hidden)))
    model = llama(hidden, layers, vocab, seed=2)
    path = f"{root}/big"
    model.save_pretrained(path)
    num_params = sum(p.numel() for p in model.parameters())
    ctl = controller_for(ModelPaths(path), 1, EngineConfig(max_batch_size=1, max_seq_len=16, gamma=0))
    state = model.state_dict()
    print(f"# weight sync: {num_params / 1e6:.1f}M params fp32 ({num_params * 4 / 2**20:.0f} MiB), "
          "1 worker, 64 MiB buckets")
    for attempt in range(2):
        seconds = ctl.sync_policy(state, version=attempt + 1)
        print(f"object store, try {attempt + 1}: {seconds:.2f} s (pack + put + fetch + load + board)")
    ctl.transport = TorchBroadcastTransport("gloo")
    for attempt in range(2):
        seconds = ctl.sync_policy(state, version=10 + attempt)
        print(f"gloo broadcast, try {attempt + 1}: {seconds:.2f} s (pack + rendezvous + broadcast + load + board)")
    ctl.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
