"""Builds the demo's tokenizer, target and drafter from a `DemoRecipe` (see `demo.recipe`).

Stages, each a `demo.train` run with its own progress bar:

1. core SFT — a small Llama learns the task from canonical solutions in both styles
   (`compact_fraction` of them compact);
2. growth — the core is grown, function-preservingly, to the target shape (`demo.grow`), then
   fine-tuned briefly at full size so every parameter has been trained;
3. drafter fit — the drafter is cut from the trained core (`demo.truncate`: some of its layers),
   then fitted to the same SFT data briefly;
4. drafter distillation — the target samples `distill_samples` completions at T = 1 with the engine,
   recording its full distribution at each position; the drafter is trained toward it (forward KL).

The recipe's `world` (`demo.world`) picks the tokenizer and the task's rendering; in the bpe world the
tokenizer is trained first (its own stage in the log), every stage trains with a sampled softmax
(`softmax_negatives`) and the drafter is distilled on the target's top `distill_top_k` probabilities.

Deterministic for a given recipe and seed (fixed data seeds, `torch.manual_seed` per stage).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ..rollout.models.lean import unfuse
from .generate import sample_completions
from .grow import grow, grown_config
from .pretrain import Example, train
from .recipe import DemoRecipe, ModelShape
from .task import Style
from .tokenizer import encode_prompt
from .truncate import truncate
from .world import task_for, tokenizer_for

# Separate problem streams per use, so training never reuses the report's evaluation problems.
SFT_SEED, TARGET_SFT_SEED, DISTILL_SEED = 1, 2, 3


@dataclass
class BuildResult:
    target: LlamaForCausalLM
    drafter: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerFast
    log: dict = field(default_factory=dict)  # seconds and final loss per stage


def llama_config(shape: ModelShape, tokenizer: PreTrainedTokenizerFast, max_position_embeddings: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )


def sft_examples(recipe: DemoRecipe, tokenizer: PreTrainedTokenizerFast, n: int, seed: int) -> list[Example]:
    """`n` canonical solutions, each compact with probability `recipe.compact_fraction`."""
    rng = random.Random(seed)
    task = task_for(recipe.world)
    examples = []
    for problem in task.make_problems(n, seed=recipe.seed * 1000 + seed, max_digits=recipe.max_digits):
        style = Style.COMPACT if rng.random() < recipe.compact_fraction else Style.VERBOSE
        prompt = encode_prompt(tokenizer, task.to_messages(problem))
        completion = tokenizer(task.solution(problem, style), add_special_tokens=False)["input_ids"]
        examples.append(Example(prompt + completion + [tokenizer.eos_token_id], len(prompt)))
    return examples


def build(recipe: DemoRecipe, progress: bool = True) -> BuildResult:
    """Run every stage; returns fp32 models in eval mode and a log of stage times and losses."""
    started = time.perf_counter()
    tokenizer = tokenizer_for(recipe.world, recipe.vocab_size, recipe.seed)
    pad, log, task = tokenizer.pad_token_id, {}, task_for(recipe.world)
    if recipe.world != "chars":
        log["tokenizer"] = {"seconds": round(time.perf_counter() - started, 1), "vocab_size": len(tokenizer)}

    def stage(name: str, model: LlamaForCausalLM, examples: list[Example], settings) -> None:
        result = train(model, examples, settings, pad, seed=recipe.seed, desc=name, progress=progress,
                       negatives=recipe.softmax_negatives)
        log[name] = {"seconds": round(result.seconds, 1), "final_loss": _tail_mean(result.losses)}

    torch.manual_seed(recipe.seed)
    core = LlamaForCausalLM(llama_config(recipe.core, tokenizer, recipe.max_position_embeddings))
    sft = sft_examples(recipe, tokenizer, recipe.core_sft.steps * recipe.core_sft.batch_size, SFT_SEED)
    stage("core SFT", core, sft, recipe.core_sft)

    shape = recipe.target
    config = grown_config(core.config, shape.hidden_size, shape.num_layers, shape.num_heads, shape.intermediate_size)
    target = grow(core, config, seed=recipe.seed)
    target_sft = sft_examples(
        recipe, tokenizer, max(1, recipe.target_sft.steps * recipe.target_sft.batch_size), TARGET_SFT_SEED
    )
    stage("target SFT", target, target_sft, recipe.target_sft)

    drafter = truncate(core, recipe.drafter.num_layers)
    stage("drafter SFT", drafter, sft, recipe.drafter_sft)

    sampling_started = time.perf_counter()
    problems = task.make_problems(recipe.distill_samples, seed=recipe.seed * 1000 + DISTILL_SEED,
                                  max_digits=recipe.max_digits)
    rollouts = sample_completions(target, tokenizer, problems, temperature=1.0,
                                  max_new_tokens=task.max_completion_tokens(recipe.max_digits),
                                  seed=recipe.seed, record_signals=True, signal_top_k=recipe.distill_top_k,
                                  world=recipe.world)
    unfuse(target)  # the engine re-laid out the target's weights; give it plain ones to save
    log["target sampling"] = {"seconds": round(time.perf_counter() - sampling_started, 1),
                              "tokens": sum(len(r.completion_ids) for r in rollouts)}
    distill = [_distill_example(r, len(tokenizer), sparse=recipe.distill_top_k is not None) for r in rollouts]
    stage("drafter distill", drafter, distill, recipe.drafter_distill)
    log["total_seconds"] = round(time.perf_counter() - started, 1)
    return BuildResult(target.eval(), drafter.eval(), tokenizer, log)


def _distill_example(rollout, vocab_size: int, sparse: bool = False) -> Example:
    """Prompt + sampled completion; soft targets = the target's distribution at each position (its
    recorded top-k as ids and probabilities when `sparse`, else scattered into a dense [T, V])."""
    signals = rollout.signals
    ids = rollout.prompt_ids + rollout.completion_ids
    if sparse:
        return Example(ids, len(rollout.prompt_ids), signals.topk_probs.float(), signals.topk_ids.long())
    soft = torch.zeros(len(rollout.completion_ids), vocab_size)  # [T, V]
    soft.scatter_(1, signals.topk_ids.long(), signals.topk_probs.float())
    return Example(ids, len(rollout.prompt_ids), soft)


def _tail_mean(losses: list[float], tail: int = 20) -> float | None:
    return round(sum(losses[-tail:]) / len(losses[-tail:]), 4) if losses else None
