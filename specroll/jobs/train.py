"""`specroll train --config configs/demo.yaml`: GRPO with speculative rollouts and online draft learning.

The main job, end to end:

1. load and validate the config (`train_config`), print it resolved;
2. build or load the models — the demo recipe (built on first use, cached) or your folders;
3. start the rollout backend — Ray workers (an embedded cluster on 127.0.0.1, or the cluster of
   `ray job submit`, whose `RAY_ADDRESS` `ray.init()` finds) or the engine in this process;
4. run a real TRL `GRPOTrainer` with `SpecrollRolloutFunc` as its `rollout_func`, with a progress
   bar showing reward, rollout tokens/s and acceptance;
5. measure speculative vs plain decoding on the same prompts with the final policy and drafter,
   and trace γ and the live batch over that rollout;
6. write the report folder (`report.write_report`) and print where it is.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, TrainerCallback
from transformers.trainer_callback import PrinterCallback

from specroll.integrations.backend import RolloutBackend
from specroll.integrations.model_source import ModelPaths, tokenizer_pair
from specroll.integrations.ray_backend.cluster import connect_ray
from specroll.jobs.report import SpeedMeasurement, write_report
from specroll.jobs.train_config import TrainConfig, load_train_config, resolved_dict
from specroll.rollout import SamplingParams, SpecEngine

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is TRL's documented hook


@dataclass
class ModelSources:
    """Where the rollout engines load the models from, and the task that goes with them."""

    target: str
    drafter: str | None
    tokenizer: PreTrainedTokenizerBase
    max_digits: int
    target_tokenizer: str | None = None  # where the engines load tokenizers for the vocabulary check
    drafter_tokenizer: str | None = None

    @property
    def paths(self) -> ModelPaths:
        return ModelPaths(self.target, self.drafter, self.target_tokenizer, self.drafter_tokenizer)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="run config YAML (e.g. configs/demo.yaml)")
    parser.add_argument("--out-dir", default=None, help="report folder (overrides report.out_dir)")


def run(args: argparse.Namespace) -> int:
    config = load_train_config(args.config)
    if args.out_dir:
        config.report.out_dir = args.out_dir
    started = time.perf_counter()
    print("specroll train: resolved config\n" + yaml.safe_dump(resolved_dict(config), sort_keys=False))
    sources = resolve_models(config)  # a first-run model build has the machine to itself: all threads
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    backend = make_backend(config, sources)
    try:
        trainer, schedule = train(config, sources, backend)
        speed = measure_speed(config, sources, trainer, backend)
    finally:
        backend.shutdown()
        _stop_ray()
    history = trainer.state.log_history
    if config.report.save_policy:
        from safetensors.torch import save_file

        from specroll.integrations.trl_hook.policy_sync import gather_policy_weights

        out = Path(config.report.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        policy = gather_policy_weights(trainer.accelerator.unwrap_model(trainer.model))
        save_file({name: t.detach().clone() for name, t in policy.items()}, str(out / "policy.safetensors"))
    wall_s = time.perf_counter() - started
    files = write_report(config.report.out_dir, history, speed, resolved_dict(config),
                         summarize(history, speed, wall_s, schedule), schedule.events, schedule.probes)
    print(f"specroll train: done in {wall_s:.0f}s; speculative {speed.spec_tokens_per_s:.0f} tok/s vs plain "
          f"{speed.plain_tokens_per_s:.0f} tok/s ({speed.speedup:.2f}x); report: {files.html}")
    return 0


def resolve_models(config: TrainConfig) -> ModelSources:
    models = config.models
    if models.source == "pretrained":
        tokenizer = AutoTokenizer.from_pretrained(models.tokenizer or models.target)
        return ModelSources(models.target, models.drafter, tokenizer, max_digits=models.task_max_digits or 10,
                            target_tokenizer=models.tokenizer or models.target, drafter_tokenizer=models.drafter)
    from specroll.demo.model_cache import load_or_build_demo_models
    from specroll.demo.recipe import DemoRecipe

    recipe = DemoRecipe() if models.recipe == "full" else DemoRecipe.tiny()
    demo = load_or_build_demo_models(recipe)
    tokenizer_dir = str(demo.path / "tokenizer")
    return ModelSources(str(demo.path / "target"), str(demo.path / "drafter"), demo.tokenizer,
                        models.task_max_digits or recipe.max_digits, tokenizer_dir, tokenizer_dir)


def make_backend(config: TrainConfig, sources: ModelSources) -> RolloutBackend:
    learner = dataclasses.replace(config.learner, temperature=config.grpo.temperature)
    if config.backend.kind == "local":
        from specroll.integrations.local_backend import LocalBackend

        drafter = AutoModelForCausalLM.from_pretrained(sources.drafter) if sources.drafter else None
        return LocalBackend.from_models(
            AutoModelForCausalLM.from_pretrained(sources.target), drafter, config.engine,
            learner if config.online_learning and drafter is not None else None,
            *tokenizer_pair(sources.paths),
        )
    from specroll.integrations.ray_backend.controller import RolloutController
    from specroll.integrations.ray_backend.settings import RayRunConfig

    _start_ray(config)
    engine = config.engine
    if config.online_learning:  # the learner lives on what verification records
        engine = dataclasses.replace(engine, record_signals=True)
    return RolloutController(RayRunConfig(
        models=sources.paths, topology=config.backend.topology, engine=engine,
        sync=config.backend.sync, learner=learner, address=config.backend.address,
        online_learning=config.online_learning,
    ))


def probe_prompts(n: int, seed: int, max_digits: int, training: list) -> list[list[dict[str, str]]]:
    """`n` demo prompts none of which is among the `training` prompts (short sums repeat across draws)."""
    from specroll.demo.task import make_prompts

    seen = {json.dumps(p, sort_keys=True) for p in training}
    chosen, draw = [], 0
    while len(chosen) < n:
        draw += 1
        for prompt in make_prompts(4 * n, seed * 1_000 + draw, max_digits):
            key = json.dumps(prompt, sort_keys=True)
            if key not in seen and len(chosen) < n:
                seen.add(key)
                chosen.append(prompt)
    return chosen


def train(config: TrainConfig, sources: ModelSources, backend: RolloutBackend) -> tuple[Any, Any]:
    """Run GRPO; returns the trainer and its hook's `LearnerSchedule` (probes, events, learner times)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from specroll.demo.reward import RewardConfig, make_reward
    from specroll.demo.task import make_prompts
    from specroll.integrations.learner_schedule import LearnerSchedule, ProbeSet
    from specroll.integrations.trl_hook.rollout_func import SpecrollRolloutFunc

    grpo = config.grpo
    out = Path(config.report.out_dir)
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(out / "tensorboard"))
    args = GRPOConfig(
        output_dir=str(out / "trainer"), max_steps=grpo.steps, num_generations=grpo.num_generations,
        per_device_train_batch_size=grpo.prompts_per_step * grpo.num_generations,
        max_completion_length=grpo.max_completion_length, learning_rate=grpo.learning_rate,
        temperature=grpo.temperature, beta=grpo.beta, num_iterations=grpo.num_iterations, seed=grpo.seed,
        bf16=grpo.bf16, deepspeed=grpo.deepspeed, use_cpu=config.engine.device == "cpu", logging_steps=1,
        save_strategy="no", report_to=_report_to(), disable_tqdm=True, **grpo.extra,
    )
    dataset = Dataset.from_dict({"prompt": make_prompts(grpo.num_train_prompts, grpo.seed, sources.max_digits)})
    probe = None
    if config.probe.prompts:
        probe = ProbeSet(probe_prompts(config.probe.prompts, grpo.seed + 2, sources.max_digits, dataset["prompt"]),
                         config.probe.every, config.probe.samples)
    schedule = LearnerSchedule(probe, config.learner_schedule.rollout_share, config.learner_schedule.update_share)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(sources.target),
        reward_funcs=make_reward(RewardConfig(config.task.brevity, config.task.format_bonus)), args=args,
        train_dataset=dataset, processing_class=sources.tokenizer,
        rollout_func=SpecrollRolloutFunc(backend, learn=config.online_learning, schedule=schedule),
        callbacks=[ProgressBar()],
    )
    trainer.remove_callback(PrinterCallback)  # the progress bar shows the numbers; the report keeps them
    trainer.train()
    return trainer, schedule


def measure_speed(config: TrainConfig, sources: ModelSources, trainer: Any,
                  backend: RolloutBackend) -> SpeedMeasurement:
    """Speculative vs plain decoding, interleaved on the same prompts, final policy and drafter.

    Runs in this process with a rollout worker's CPU threads (Ray pins an actor's torch to its
    `num_cpus`), so the numbers are comparable with the `rollout/tokens_per_s` of training.
    """
    threads = torch.get_num_threads()
    if config.backend.kind == "ray":
        torch.set_num_threads(max(1, int(config.backend.topology.worker.num_cpus)))
    try:
        return _measure_speed(config, sources, trainer, backend)
    finally:
        torch.set_num_threads(threads)


def _measure_speed(config: TrainConfig, sources: ModelSources, trainer: Any,
                   backend: RolloutBackend) -> SpeedMeasurement:
    from specroll.demo.task import make_prompts
    from specroll.integrations.trl_hook.policy_sync import gather_policy_weights
    from specroll.integrations.trl_hook.rollout_func import tokenize_prompts

    policy = gather_policy_weights(trainer.accelerator.unwrap_model(trainer.model))
    drafter = AutoModelForCausalLM.from_pretrained(sources.drafter) if sources.drafter else None
    engine_config = dataclasses.replace(config.engine, record_signals=False)
    spec = SpecEngine(AutoModelForCausalLM.from_pretrained(sources.target), drafter, engine_config,
                      *tokenizer_pair(sources.paths))
    spec.update_target(policy, trainer.state.global_step)
    published = backend.published_drafter()
    if drafter is not None and published:
        spec.update_drafter(published, version=-1)
    plain = SpecEngine(spec.target.model, None, engine_config)
    prompts = make_prompts(config.report.speed_prompts, config.grpo.seed + 1, sources.max_digits)
    prompt_ids = tokenize_prompts(prompts, trainer)
    params = SamplingParams(max_new_tokens=config.grpo.max_completion_length, temperature=config.grpo.temperature,
                            stop_token_ids=tuple(trainer.eos_token_ids), seed=config.grpo.seed)
    trace = None
    for _ in range(config.report.speed_repeats):
        for engine in (spec, plain):
            engine.generate(prompt_ids, params, n=config.grpo.num_generations)
        if trace is None:
            trace = (list(spec.stats.gamma_per_step), list(spec.stats.live_rows_per_step))
    return SpeedMeasurement(
        spec_tokens_per_s=spec.stats.tokens_per_s, plain_tokens_per_s=plain.stats.tokens_per_s,
        acceptance_rate=spec.stats.acceptance_rate, mean_accepted_len=spec.stats.mean_accepted_len,
        gamma_per_step=trace[0], live_rows_per_step=trace[1],
    )


def summarize(history: list[dict], speed: SpeedMeasurement, wall_s: float, schedule: Any) -> dict[str, Any]:
    steps = [e for e in history if "reward" in e]
    first, last = (steps[0], steps[-1]) if steps else ({}, {})
    keys = ("reward", "rollout/tokens_per_s", "rollout/acceptance_rate", "drafter/version")
    probes = schedule.probes
    drift = {}
    if probes:
        drift = {f"{where}_{name}": probe[f"drafter/probe_{name}"] for where, probe in (("first", probes[0]),
                 ("last", probes[-1])) for name in ("online", "frozen", "gain", "gain_se")}
        drift["first_step"], drift["last_step"] = probes[0]["step"], probes[-1]["step"]
    return {
        "wall_time_s": wall_s,
        "steps": len(steps),
        "first_step": {k: first.get(k) for k in keys},
        "last_step": {k: last.get(k) for k in keys},
        "probe": drift,
        "learner": {**vars(schedule.times), **schedule.times.shares(), "events": len(schedule.events)},
        "speedup_vs_plain": speed.speedup,
    }


class ProgressBar(TrainerCallback):
    """One tqdm bar over GRPO steps with reward, rollout tokens/s and acceptance as they are logged."""

    def on_train_begin(self, args, state, control, **kwargs):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=state.max_steps, desc="GRPO", unit="step")

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        shown = {"reward": "reward", "rollout/tokens_per_s": "tok/s", "rollout/acceptance_rate": "accept",
                 "drafter/version": "drafter"}
        self.bar.set_postfix({label: f"{logs[k]:.3g}" for k, label in shown.items() if logs.get(k) is not None})
        self.bar.n = state.global_step
        self.bar.refresh()

    def on_train_end(self, args, state, control, **kwargs):
        self.bar.close()
        if state.log_history:
            print(json.dumps({k: v for k, v in state.log_history[-1].items() if isinstance(v, (int, float))}))


def _report_to() -> list[str]:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return []
    return ["tensorboard"]


def _start_ray(config: TrainConfig) -> None:
    import ray

    topo = config.backend.topology
    cpus = topo.num_workers * topo.worker.num_cpus + (topo.learner.num_cpus if config.online_learning else 0)
    num_cpus = max(int(cpus + 0.999), 1)
    # Under `ray job submit` its RAY_ADDRESS (the GCS address) is joined; otherwise an embedded,
    # loopback-only cluster with Ray's token auth on (ray_cluster's docstring says why it is safe).
    if connect_ray(config.backend.address, num_cpus, log_to_driver=False) == "joined":
        print(f"specroll train: joined the Ray cluster at {ray.get_runtime_context().gcs_address}", flush=True)
    else:
        print(f"specroll train: started an embedded Ray cluster ({num_cpus} CPUs, 127.0.0.1 only)", flush=True)


def _stop_ray() -> None:
    """Shut down the embedded cluster; in a joined cluster (a Ray job) this disconnects the driver only."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
