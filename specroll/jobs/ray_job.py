"""The Ray entry point: rollout rounds with online draft learning, on a laptop or a cluster.

    python -m specroll.jobs.ray_job --config configs/ray_local.yaml [--make-tiny-models]
    ray job submit --address http://127.0.0.1:8265 -- python -m specroll.jobs.ray_job \
        --config "$PWD/configs/ray_local.yaml"

It joins the cluster of `ray job submit` (which sets `RAY_ADDRESS`) or the config's `address`, and
otherwise starts an embedded loopback-only cluster (`ray_cluster.connect_ray`). Each round generates `job.n` samples of
`job.num_prompts` synthetic prompts, runs one learner round (publishing a new drafter to the workers
if it measured better), and prints one JSON line of metrics; the resolved config is printed first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig

from specroll.integrations.backend import learner_round
from specroll.integrations.model_source import ModelPaths
from specroll.integrations.ray_backend.cluster import connect_ray
from specroll.integrations.ray_backend.controller import RolloutController
from specroll.integrations.ray_backend.settings import RayRunConfig
from specroll.integrations.yaml_config import load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML file of a RayRunConfig")
    parser.add_argument("--make-tiny-models", action="store_true",
                        help="write random tiny Llama target/drafter at the config's model paths if missing")


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, RayRunConfig)
    if args.make_tiny_models:
        make_tiny_models(config.models)
    print(json.dumps({"config": dataclasses.asdict(config)}, default=str), flush=True)
    connect_ray(config.address, num_cpus=None)
    controller = RolloutController(config)
    try:
        vocab = AutoConfig.from_pretrained(config.models.target).vocab_size
        generator = torch.Generator().manual_seed(config.job.seed)
        for round_index in range(config.job.rounds):
            prompts = torch.randint(vocab, (config.job.num_prompts, config.job.prompt_len), generator=generator)
            rollouts = controller.generate(prompts.tolist(), config.sampling, n=config.job.n)
            done = learner_round(controller)
            line = {"round": round_index, "rollouts": len(rollouts), **controller.metrics(),
                    "drafter_published": bool(done and done.report.published)}
            print(json.dumps(line), flush=True)
    finally:
        controller.shutdown()
    return 0


def make_tiny_models(models: ModelPaths) -> None:
    """Random tiny Llama models (vocab 64) at `models`' paths, for smoke runs without downloads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    for path, hidden, layers in ((models.target, 64, 2), (models.drafter, 32, 1)):
        if path is None or Path(path).exists():
            continue
        torch.manual_seed(hidden)
        config = LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=256)
        LlamaForCausalLM(config).save_pretrained(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specroll.jobs.ray_job", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
