"""The end-of-run speed measurement of `specroll train`: speculative vs plain decoding, interleaved on the
same prompts, with the final policy and the drafter the learner publishes, and the γ / live-batch trace
of one speculative rollout batch (the report's last plot).

The speculative engine starts from what the run's (first) rollout engine learnt (`RolloutBackend.engine_states`:
γ statistics, suffix history), as a rollout engine does at every step of a run: a fresh engine knows nothing of
its drafter, measures acceptance on its first drafting step — the start of the completions, where this world's
style is chosen and acceptance is lowest — and, judged on it, decoded plainly until its next exploration step
(measured in the cold start's closing measurement: 1.02x plain while its last rollouts ran 1.25x)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from specroll.integrations.backend import RolloutBackend
from specroll.integrations.model_source import ModelPaths, load_drafter, tokenizer_pair
from specroll.integrations.trl_hook.policy_sync import gather_policy_weights
from specroll.integrations.trl_hook.rollout_func import tokenize_prompts
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.engine import load_engine_state

from .backends import ModelSources
from .report import SpeedMeasurement
from .task_source import Task
from .train_config import TrainConfig


def measure_speed(config: TrainConfig, sources: ModelSources, task: Task, trainer: Any,
                  backend: RolloutBackend) -> SpeedMeasurement:
    """Runs in this process with a rollout worker's CPU threads (Ray pins an actor's torch to its
    `num_cpus`), so the numbers are comparable with the `rollout/tokens_per_s` of training."""
    threads = torch.get_num_threads()
    if config.backend.kind == "ray":
        torch.set_num_threads(max(1, int(config.backend.topology.worker.num_cpus)))
    try:
        return _measure_speed(config, sources, task, trainer, backend)
    finally:
        torch.set_num_threads(threads)


def _measure_speed(config: TrainConfig, sources: ModelSources, task: Task, trainer: Any,
                   backend: RolloutBackend) -> SpeedMeasurement:
    policy = gather_policy_weights(trainer.accelerator.unwrap_model(trainer.model))
    spec, plain = closing_engines(config.engine, sources.paths, policy, trainer.state.global_step, backend)
    prompt_ids = tokenize_prompts(task.prompts(config.report.speed_prompts, config.grpo.seed + 1), trainer)
    params = SamplingParams(max_new_tokens=config.grpo.max_completion_length, temperature=config.grpo.temperature,
                            stop_token_ids=tuple(trainer.eos_token_ids), seed=config.grpo.seed)
    trace = None
    for _ in range(config.report.speed_repeats):
        for engine in (spec, plain):
            engine.generate(prompt_ids, params, n=config.grpo.num_generations)
        if trace is None:
            trace = (list(spec.stats.gamma_per_step), list(spec.stats.live_rows_per_step),
                     list(spec.stats.tokens_per_step))
    return SpeedMeasurement(
        spec_tokens_per_s=spec.stats.tokens_per_s, plain_tokens_per_s=plain.stats.tokens_per_s,
        acceptance_rate=spec.stats.acceptance_rate, mean_accepted_len=spec.stats.mean_accepted_len,
        gamma_per_step=trace[0], live_rows_per_step=trace[1], tokens_per_step=trace[2],
    )


def closing_engines(config: EngineConfig, paths: ModelPaths, policy: dict[str, torch.Tensor], version: int,
                    backend: RolloutBackend) -> tuple[SpecEngine, SpecEngine]:
    """The measurement's two engines over one target model holding `policy`: the speculative one with the drafter
    the learner publishes, starting from what the run's first rollout engine learnt, and a plain one. On vLLM
    (`engine.kind: vllm`) the run's own engine, synced to `policy`, against a plain vLLM engine."""
    if config.kind == "vllm":
        return vllm_closing_engines(config, paths, policy, version, backend)
    target = AutoModelForCausalLM.from_pretrained(paths.target)
    drafter = load_drafter(paths, config, target)
    config = dataclasses.replace(config, record_signals=False)
    spec = SpecEngine(target, drafter, config, *tokenizer_pair(paths))
    spec.update_target(policy, version)
    published = backend.published_drafter()
    if drafter is not None and published is not None:
        spec.load_drafter(published)
    states = backend.engine_states()
    if drafter is not None and states:
        load_engine_state(spec, states[0])
    # plain decoding has no drafter, so no draft vocabulary to cut (the config's applies to the drafter)
    plain = SpecEngine(spec.target.model, None, dataclasses.replace(config, draft_vocab=None))
    return spec, plain


def vllm_closing_engines(config: EngineConfig, paths: ModelPaths, policy: dict[str, torch.Tensor], version: int,
                         backend: RolloutBackend) -> tuple[Any, Any]:
    """The run's vLLM engine (its drafter the one the learner publishes), synced to `policy`, and a plain vLLM
    engine built on the same weights. The two take turns; neither runs while the other does."""
    from specroll.integrations.vllm.engine import VllmEngine

    backend.sync_policy(policy, version)
    target = AutoModelForCausalLM.from_pretrained(paths.target)
    target.load_state_dict(policy, strict=False)
    plain_config = dataclasses.replace(config, gamma=0, drafters=None, draft_vocab=None, record_signals=False)
    plain = VllmEngine.from_models(target, None, plain_config, backend.engine.settings, tokenizer_pair(paths)[0])
    return backend.engine, plain
