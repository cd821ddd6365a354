"""Sampling from the demo models with specroll's own engine (plain batched decoding, γ = 0).

Used by the build (the target's samples that the drafter is distilled on) and by the model report.
With `record_signals` every rollout carries the target's processed distribution at each position —
the whole vocabulary by default, which is exactly the distillation target, or its top `signal_top_k`
entries (at a 32k vocabulary the whole distribution of every position would not fit in memory).
"""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerFast

from ..rollout import EngineConfig, Rollout, SamplingParams, SpecEngine
from .tokenizer import encode_prompt
from .world import task_for


def sample_completions(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, problems: list,
                       temperature: float, max_new_tokens: int, seed: int, batch_size: int = 64,
                       record_signals: bool = False, signal_top_k: int | None = None,
                       world: str = "chars") -> list[Rollout]:
    """One completion per problem of `world`'s task, in order; each stops at EOS (kept as its last
    token) or the limit."""
    to_messages = task_for(world).to_messages
    prompts = [encode_prompt(tokenizer, to_messages(p)) for p in problems]
    top_k = signal_top_k or model.get_output_embeddings().weight.shape[0]
    config = EngineConfig(
        max_batch_size=batch_size,
        max_seq_len=max(len(p) for p in prompts) + max_new_tokens,
        gamma=0,
        record_signals=record_signals,
        signal_top_k=top_k,
    )
    engine = SpecEngine(model, None, config)
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        stop_token_ids=(tokenizer.eos_token_id,),
        seed=seed,
    )
    return engine.generate(prompts, params)


def completion_texts(tokenizer: PreTrainedTokenizerFast, rollouts: list[Rollout]) -> list[str]:
    """Decoded completions without special tokens — what TRL hands a reward function."""
    return [tokenizer.decode(r.completion_ids, skip_special_tokens=True) for r in rollouts]
