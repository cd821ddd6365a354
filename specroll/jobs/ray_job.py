"""The Ray rollout job: rollout rounds with online draft learning, on a laptop or a cluster.

    python -m specroll.jobs.ray_job --config configs/ray_local.yaml [--make-tiny-models]
    ray job submit --address http://127.0.0.1:8265 -- python -m specroll.jobs.ray_job \
        --config "$PWD/configs/ray_local.yaml"

It reads the same run config as `specroll train` (`train_config.TrainConfig`, `backend.kind: ray`) and
starts the same backend (`backends.make_backend`): it joins the cluster of `ray job submit` (which sets
`RAY_ADDRESS`) or `backend.address`, and otherwise starts an embedded loopback-only cluster. Each of
`grpo.steps` rounds generates `grpo.num_generations` samples (up to `grpo.max_completion_length`
tokens at `grpo.temperature`) of `grpo.prompts_per_step` random prompts, runs one learner round
(publishing a new drafter to the workers if it measured better), and prints one JSON line of metrics
(docs/metrics.md); the resolved config is printed first. No trainer: the policy stays as loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="run config YAML (e.g. configs/ray_local.yaml)")
    parser.add_argument("--prompt-len", type=int, default=8, help="tokens per random prompt (default 8)")
    parser.add_argument("--make-tiny-models", action="store_true",
                        help="write random tiny Llama target/drafter at the config's model paths if missing")


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoConfig

    from specroll.integrations.backend import learner_round, rollout_metrics
    from specroll.integrations.yaml_config import ConfigError
    from specroll.rollout import SamplingParams

    from .backends import make_backend, resolve_models, stop_ray
    from .train_config import load_train_config, resolved_dict

    config = load_train_config(args.config)
    if config.backend.kind != "ray":
        raise ConfigError(f"backend.kind={config.backend.kind!r} is invalid for the Ray job: 'ray'")
    if args.make_tiny_models:
        make_tiny_models(config.models.target, config.models.drafter)
    print(json.dumps({"config": resolved_dict(config)}), flush=True)
    sources = resolve_models(config)
    grpo = config.grpo
    params = SamplingParams(max_new_tokens=grpo.max_completion_length, temperature=grpo.temperature)
    backend = make_backend(config, sources)
    try:
        vocab = AutoConfig.from_pretrained(sources.paths.target).vocab_size
        generator = torch.Generator().manual_seed(grpo.seed)
        for round_index in range(grpo.steps):
            prompts = torch.randint(vocab, (grpo.prompts_per_step, args.prompt_len), generator=generator)
            rollouts = backend.generate(prompts.tolist(), params, n=grpo.num_generations)
            done = learner_round(backend)
            line = {"round": round_index, "rollouts": len(rollouts), **rollout_metrics(backend.batch_stats()),
                    **backend.metrics(), "drafter_published": bool(done and done.report.published)}
            print(json.dumps(line), flush=True)
    finally:
        backend.shutdown()
        stop_ray()
    return 0


def make_tiny_models(target: str | None, drafter: str | None) -> None:
    """Random tiny Llama models (vocab 64) at these paths, if missing, for smoke runs without downloads."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    for path, hidden, layers in ((target, 64, 2), (drafter, 32, 1)):
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
