"""Models and prompts the benchmarks run on.

`demo`: the embedded demo's target and drafter (trained here; the drafter distilled from the
target's own samples, so its agreement is realistic) on task prompts. `demo-bpe`: the same from the
subword world's recipe (`DemoRecipe.bpe()`, built on first use). `real-shape`: a Qwen2.5-0.5B-shaped target
(494M, tied 152k head) and the 2 × 384 drafter LM of `bench.real_shape`, random init, on random prompts: a speed
workload — they agree on no greedy token and, their distributions being flat, on ~60 % of drafts at T = 1. `tiny`: two
small random Llamas on random prompts — a seconds-long smoke run of the benchmark code, not a measurement.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

if TYPE_CHECKING:
    from specroll.jobs.backends import ModelSources
    from specroll.jobs.train_config import TrainConfig


@dataclass
class BenchModels:
    target: PreTrainedModel
    drafter: PreTrainedModel
    prompts: list[list[int]]
    stop_token_ids: tuple[int, ...]
    pad_id: int
    description: str
    path: Path | None = None  # the demo build's folder (trained heads are cached beside it); None: tiny


def _params(model: PreTrainedModel) -> str:
    return f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M"


def load_bench_models(kind: str, num_prompts: int, seed: int = 0) -> BenchModels:
    if kind == "demo":
        return _demo_models(num_prompts, seed, bpe=False)
    if kind == "demo-bpe":
        return _demo_models(num_prompts, seed, bpe=True)
    if kind == "tiny":
        return _tiny_models(num_prompts, seed)
    if kind == "real-shape":
        return _real_shape_models(num_prompts, seed)
    raise ValueError(f"models={kind!r} is invalid: 'demo', 'demo-bpe', 'real-shape' or 'tiny'")


def _demo_models(num_prompts: int, seed: int, bpe: bool) -> BenchModels:
    from specroll.demo.model_cache import load_or_build_demo_models
    from specroll.demo.tokenizer import encode_prompt

    if bpe:
        from specroll.demo.recipe import DemoRecipe
        from specroll.demo.world import task_for

        demo = load_or_build_demo_models(DemoRecipe.bpe())
        messages = task_for(demo.recipe.world).make_prompts(num_prompts, seed=seed, max_digits=demo.recipe.max_digits)
    else:
        from specroll.demo.task import make_prompts

        demo = load_or_build_demo_models()
        messages = make_prompts(num_prompts, seed=seed)
    tok = demo.tokenizer
    prompts = [encode_prompt(tok, m) for m in messages]
    return BenchModels(
        target=demo.target, drafter=demo.drafter, prompts=[list(map(int, p)) for p in prompts],
        stop_token_ids=(tok.eos_token_id,), pad_id=tok.pad_token_id,
        description=f"demo{'-bpe' if bpe else ''} models: target {_params(demo.target)}, drafter "
                    f"{_params(demo.drafter)} (distilled from the target's samples)",
        path=demo.path,
    )


def _tiny_models(num_prompts: int, seed: int) -> BenchModels:
    def build(layers: int, hidden: int, model_seed: int) -> PreTrainedModel:
        torch.manual_seed(model_seed)
        cfg = LlamaConfig(vocab_size=96, hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=layers, num_attention_heads=hidden // 32, num_key_value_heads=1,
                          max_position_embeddings=1024)  # heads of 32: the smallest vLLM's CPU attention runs
        return LlamaForCausalLM(cfg).eval()

    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 96) for _ in range(rng.randint(4, 12))] for _ in range(num_prompts)]
    target, drafter = build(2, 64, seed), build(1, 32, seed + 1)
    return BenchModels(target, drafter, prompts, stop_token_ids=(2,), pad_id=0,
                       description=f"tiny random models (smoke run): {_params(target)} / {_params(drafter)}")


def _real_shape_models(num_prompts: int, seed: int) -> BenchModels:
    from .shapes import SHAPES, build

    target = build("target", seed=seed, tied=True)
    drafter = build("drafter_2x384", seed=seed + 1, tied=True)
    rng = random.Random(seed)
    vocab = SHAPES["target"].vocab
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(16, 48))] for _ in range(num_prompts)]
    return BenchModels(target, drafter, prompts, stop_token_ids=(2,), pad_id=0,
                       description=f"real-shape random pair: Qwen2.5-0.5B-shaped target {_params(target)}, "
                                   f"2 x 384 drafter {_params(drafter)}, tied heads, fp32")


@dataclass
class ConfigWorld:
    """A `specroll train` config whose models are the demo's: the config, its resolved models and its target."""

    config: TrainConfig
    sources: ModelSources
    target: PreTrainedModel

    def task_prompts(self, num_prompts: int, seed: int) -> list[list[int]]:
        """`num_prompts` prompts of the config's task, token ids."""
        from specroll.demo.tokenizer import encode_prompt
        from specroll.demo.world import task_for

        messages = task_for(self.sources.world).make_prompts(num_prompts, seed=seed,
                                                             max_digits=self.sources.max_digits)
        return [list(map(int, encode_prompt(self.sources.tokenizer, m))) for m in messages]


def load_config_world(config_path: str) -> ConfigWorld:
    """The models of the `specroll train` config at `config_path`, which must be the demo's (`models.source:
    demo`: the benchmarks' prompts are its task's); raises ValueError otherwise."""
    from transformers import AutoModelForCausalLM

    from specroll.jobs.backends import resolve_models
    from specroll.jobs.train_config import load_train_config

    config = load_train_config(config_path)
    if config.models.source != "demo":
        raise ValueError(f"--config {config_path}: its models must be the demo's (models.source: demo): the "
                         "prompts are its task's")
    sources = resolve_models(config)
    return ConfigWorld(config, sources, AutoModelForCausalLM.from_pretrained(sources.paths.target).eval())
