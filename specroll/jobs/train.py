"""`specroll train --config configs/demo.yaml`: GRPO with speculative rollouts and online draft learning.

The main job, end to end:

1. load and validate the config (`train_config`), print it resolved;
2. build or load the models — the demo recipe (built on first use, cached, saying so) or your
   folders — and the task: the demo's, or your dataset and reward (`task_source`);
3. start the rollout backend — Ray workers (an embedded cluster on 127.0.0.1, or the cluster of
   `ray job submit`, whose `RAY_ADDRESS` `ray.init()` finds) or the engine in this process;
4. run a real TRL `GRPOTrainer` with `SpecrollRolloutFunc` as its `rollout_func`, with a progress
   bar showing reward, rollout tokens/s and acceptance;
5. measure speculative vs plain decoding on the same prompts with the final policy and drafter,
   and trace γ and the live batch over that rollout;
6. keep what it trained (`checkpoint.final`, on by default): the policy and tokenizer in `<out>/policy`
   (`save_pretrained`), the drafter it ends with in `<out>/drafter` in its kind's public layout
   (`integrations.drafter_export`: a Hugging Face folder, or the speculators layout vLLM serves);
7. write the report folder (`report.write_report`) and print where it is, with the model build's
   seconds apart from the run's.

`specroll train --config X grpo.steps=4 engine.gamma=3` sets fields over the YAML's, checked as the YAML is;
`report.report_to` picks the trackers (TensorBoard, W&B, trackio); a missing extra (TRL, Ray, matplotlib) is one
`pip install "specroll[...]"` line before anything loads.

With `checkpoint.every` > 0 the run saves a trainer checkpoint with specroll's state beside it (`resume`);
`--resume DIR` (a run's report folder: its newest whole checkpoint; or one `trainer/checkpoint-<step>`
folder) goes on from one, writing into that run's folder unless `--out-dir` says otherwise (docs/resume.md).

Under `accelerate launch` (docs/ray.md, *Several trainer processes*) every rank runs steps 1-4; the
main rank builds the demo models first, creates the shared Ray service (the others attach), measures
the speed and writes the report; it stops the service last.

Only argparse is imported at module level: `specroll train --help` answers before torch loads.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="run config YAML (e.g. configs/demo.yaml)")
    parser.add_argument("--out-dir", default=None, help="report folder (overrides report.out_dir; with --resume, "
                        "the resumed run's folder)")
    parser.add_argument("overrides", nargs="*", metavar="section.field=value",
                        help="set a config field over the YAML's, checked as the YAML is (e.g. grpo.steps=4 "
                             "engine.gamma=3)")
    parser.add_argument("--resume", default=None, metavar="DIR",
                        help="go on from a checkpoint: a run's report folder (its newest whole checkpoint) or one "
                             "of its trainer/checkpoint-<step> folders")


def run(args: argparse.Namespace, between_steps: Callable[[], None] | None = None) -> int:
    """Run the job of `args` (`add_arguments`'s); `between_steps` as `SpecrollRolloutFunc`'s (a benchmark's
    hook: two runs taking turns step by step, `tools.interleave`)."""
    from specroll.integrations.yaml_config import read_yaml

    data = read_yaml(args.config)  # a missing file or bad YAML fails now, not after seconds of imports
    check_extras(data, getattr(args, "overrides", ()))
    import yaml

    from specroll.integrations.threads import set_torch_threads
    from specroll.integrations.trl_hook.policy_sync import gather_policy_weights
    from specroll.integrations.yaml_config import ConfigError

    from .backends import driver_threads, make_backend, resolve_models, stop_ray, trainer_ranks
    from .checkpoints import find_checkpoint
    from .report import headline_lines, write_report
    from .resume import check_matches, resumes_of
    from .speed import measure_speed
    from .task_source import load_task
    from .train_config import load_train_config, resolved_dict

    config = load_train_config(args.config, getattr(args, "overrides", ()))
    saved = None
    resume = getattr(args, "resume", None)  # a namespace built by hand (a script, a test) may leave it out
    if resume:
        saved = find_checkpoint(resume)
        check_matches(saved, config)
        config.report.out_dir = str(saved.run_dir)
    if args.out_dir:
        config.report.out_dir = args.out_dir
    started = time.perf_counter()
    ranks = trainer_ranks(config)  # None unless a launcher (accelerate launch, torchrun) started several ranks
    if ranks is not None and (config.checkpoint.every or saved is not None):
        raise ConfigError(f"checkpoint.every={config.checkpoint.every} (or --resume) is invalid with "
                          f"{ranks.num_processes} trainer ranks: specroll checkpoints and resumes one trainer "
                          "process; set checkpoint.every: 0 under accelerate launch")
    main = ranks is None or ranks.is_main
    if saved is not None:
        logger.info(f"specroll train: resuming from {saved.path} (step {saved.step}) into {config.report.out_dir}")
    if main:
        logger.info("specroll train: resolved config\n" + yaml.safe_dump(resolved_dict(config), sort_keys=False))
    with ranks.main_first() if ranks is not None else contextlib.nullcontext():  # one rank builds the demo models
        sources = resolve_models(config)  # a first-run model build has the machine to itself: all threads
    if sources.tokenizer is None:
        raise ConfigError(f"models.tokenizer={config.models.tokenizer!r} is invalid: no tokenizer found for "
                          f"{sources.paths.target} (GRPO needs one: set models.tokenizer)")
    task = load_task(config.task, sources.max_digits, sources.world)
    driver = set_torch_threads(driver_threads(config), "driver (trainer)" if ranks is None
                               else f"trainer rank {ranks.rank}")
    backend = make_backend(config, sources, ranks)
    try:
        threads = [driver, *(backend.process_threads() if main else [])]
        logger.info("specroll: torch threads per process (set from the config, whatever OMP_NUM_THREADS says): "
              + "; ".join(t.line() for t in threads))
        if saved is not None:
            backend.load_state_dict(saved.backend_state())
        trainer, schedule = train(config, sources, task, backend, saved, between_steps)
        published = backend.published_drafter() if main else None  # the drafter the run ends with
        if main:
            speed = measure_speed(config, sources, task, trainer, backend)
        else:  # the main rank's measurement gathers ZeRO-3 weights: a collective every rank joins
            gather_policy_weights(trainer.accelerator.unwrap_model(trainer.model), keep=False)
    except BaseException:
        backend.shutdown()
        if config.backend.kind == "ray":
            stop_ray()
        raise
    stop_backend(config, backend, ranks)
    if config.checkpoint.final:
        keep_final(trainer, config, sources, published, write=main)
    if config.report.save_policy:
        save_policy(trainer, Path(config.report.out_dir), write=main)
    if not main:
        return 0
    history = trainer.state.log_history
    wall_s = time.perf_counter() - started
    summary = summarize(history, speed, wall_s, sources.build_s, schedule, threads, config.online_learning)
    if saved is not None:
        summary["resumed"] = resumes_of(saved)
    files = write_report(config.report.out_dir, history, speed, resolved_dict(config), summary, schedule.events,
                         schedule.probes)
    for line in headline_lines(summary["headline"]):
        logger.info(f"specroll train: {line}")
    built = f"model build {sources.build_s:.0f}s + " if sources.build_s else ""
    logger.info(f"specroll train: done in {built}run {wall_s - sources.build_s:.0f}s; speculative "
          f"{speed.spec_tokens_per_s:.0f} tok/s vs plain {speed.plain_tokens_per_s:.0f} tok/s "
          f"({speed.speedup:.2f}x); report: {files.html}")
    return 0


def stop_backend(config: Any, backend: Any, ranks: Any | None) -> None:
    """Shut the backend (and the Ray this run started) down; with several ranks, the main rank's last:
    its actors and embedded cluster outlive every other rank's use of them."""
    from .backends import stop_ray

    main = ranks is None or ranks.is_main
    if not main:
        backend.shutdown()
        if config.backend.kind == "ray":
            stop_ray()
    if ranks is not None:
        ranks.barrier()
    if main:
        backend.shutdown()
        if config.backend.kind == "ray":
            stop_ray()


def keep_final(trainer: Any, config: Any, sources: Any, published: Any, write: bool = True) -> None:
    """`checkpoint.final`: the final policy and its tokenizer in `out_dir/policy` (`save_pretrained`: the target's
    architecture with the trained weights — a PEFT adapter merged, ZeRO-3 gathered), and the drafter the run ends
    with (`published`: the learner's, None: as loaded) in `out_dir/drafter` (`integrations.drafter_export`).

    Every rank calls it (a ZeRO-3 gather is collective); only the one with `write` keeps and writes them."""
    from transformers import AutoModelForCausalLM

    from specroll.integrations.drafter_export import export_run_drafter
    from specroll.integrations.model_source import load_tokenizer
    from specroll.integrations.trl_hook.policy_sync import gather_policy_weights
    from specroll.rollout.models.weights import copy_into

    weights = gather_policy_weights(trainer.accelerator.unwrap_model(trainer.model), keep=write)
    if not write:
        return
    out = Path(config.report.out_dir)
    policy = AutoModelForCausalLM.from_pretrained(sources.paths.target)
    copy_into(policy, weights, "the final policy")
    policy.save_pretrained(out / "policy")
    sources.tokenizer.save_pretrained(out / "policy")
    logger.info(f"specroll train: final policy (and tokenizer) in {out / 'policy'}")
    exported = export_run_drafter(sources.paths, config.engine, policy, published, out / "drafter",
                                  load_tokenizer(sources.paths.drafter_tokenizer or sources.paths.drafter),
                                  verifier=str((out / "policy").resolve()))
    if exported is not None:
        layouts = ", ".join(f"{name}: {path}" for name, path in exported.layouts.items())
        logger.info(f"specroll train: final {exported.kind} drafter in {layouts}; to serve both again:\n"
                    + exported.models_yaml(out / "policy"))


def save_policy(trainer: Any, out: Path, write: bool = True) -> None:
    """The final policy's weights in `out/policy.safetensors` (to compare two runs parameter by parameter).

    Every rank calls it (a ZeRO-3 gather is collective); only the one with `write` keeps and writes them."""
    from safetensors.torch import save_file

    from specroll.integrations.trl_hook.policy_sync import gather_policy_weights

    policy = gather_policy_weights(trainer.accelerator.unwrap_model(trainer.model), keep=write)
    if not write:
        return
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: t.detach().clone() for name, t in policy.items()}, str(out / "policy.safetensors"))


def train(config: Any, sources: Any, task: Any, backend: Any, saved: Any | None = None,
          between_steps: Callable[[], None] | None = None) -> tuple[Any, Any]:
    """Run GRPO (a `TrainConfig`, `ModelSources`, `Task`, `RolloutBackend`), from the start or from `saved`
    (a `checkpoints.SavedRun`, whose backend state is loaded already); returns the trainer and its hook's
    `LearnerSchedule` (probes, events, learner times). `between_steps`: the hook's (`SpecrollRolloutFunc`)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is TRL's documented hook
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from specroll.integrations.learner_schedule import LearnerSchedule, ProbeSet
    from specroll.integrations.trl_hook import SpecrollRolloutFunc, length_grouped

    from .progress import progress_bar
    from .resume import ResumeCallback, load_finished_run, restore_run, resumes_of
    from .task_source import probe_prompts

    grpo = config.grpo
    out = Path(config.report.out_dir)
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(out / "tensorboard"))
    report_to = _report_to(config.report)
    if "wandb" in report_to:  # W&B's run folder with the report (WANDB_DIR, WANDB_PROJECT, WANDB_MODE decide)
        out.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_DIR", str(out))
        os.environ.setdefault("WANDB_PROJECT", "specroll")
    args = GRPOConfig(
        output_dir=str(out / "trainer"), max_steps=grpo.steps, num_generations=grpo.num_generations,
        per_device_train_batch_size=grpo.prompts_per_step * grpo.num_generations,
        max_completion_length=grpo.max_completion_length, learning_rate=grpo.learning_rate,
        temperature=grpo.temperature, beta=grpo.beta, num_iterations=grpo.num_iterations, seed=grpo.seed,
        bf16=grpo.bf16, deepspeed=grpo.deepspeed, use_cpu=config.engine.device == "cpu", logging_steps=1,
        report_to=report_to, disable_tqdm=True, **_checkpointing(config.checkpoint), **grpo.extra,
    )
    dataset = Dataset.from_dict({"prompt": task.prompts(grpo.num_train_prompts, grpo.seed)})
    probe = None
    if config.probe.prompts:
        probe = ProbeSet(probe_prompts(task, config.probe.prompts, grpo.seed + 2, dataset["prompt"]),
                         config.probe.every, config.probe.samples)
    schedule = LearnerSchedule(probe, config.learner_schedule.rollout_share, config.learner_schedule.update_share,
                               speculation_events=config.engine.speculation == "when_learned",
                               cold_uses_update=config.learner_schedule.cold_uses_update)
    rollout_func = SpecrollRolloutFunc(backend, learn=config.online_learning, schedule=schedule,
                                       between_steps=between_steps)
    trainer_class = length_grouped(GRPOTrainer) if grpo.length_grouped else GRPOTrainer
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(sources.paths.target), reward_funcs=task.reward_funcs, args=args,
        train_dataset=dataset, processing_class=sources.tokenizer, rollout_func=rollout_func,
        callbacks=[progress_bar()],
    )
    trainer.remove_callback(PrinterCallback)  # the progress bar shows the numbers; the report keeps them
    if config.checkpoint.every:
        trainer.add_callback(ResumeCallback(trainer, rollout_func, schedule, backend, config,
                                            resumes_of(saved) if saved is not None else []))
    if saved is not None:
        restore_run(saved, trainer, rollout_func, schedule)
    if saved is not None and saved.step >= grpo.steps:
        logger.info(f"specroll train: checkpoint {saved.step} is at or past grpo.steps={grpo.steps}: no step left, "
              "the report is written from it")
        load_finished_run(saved, trainer)
    else:
        trainer.train(resume_from_checkpoint=None if saved is None else str(saved.path))
    return trainer, schedule


def _checkpointing(checkpoint: Any) -> dict[str, Any]:
    """The `GRPOConfig` fields of the `checkpoint` section (`CheckpointSettings`)."""
    if not checkpoint.every:
        return {"save_strategy": "no"}
    return {"save_strategy": "steps", "save_steps": checkpoint.every, "save_total_limit": checkpoint.keep}


def summarize(history: list[dict], speed: Any, wall_s: float, build_s: float, schedule: Any,
              threads: list[Any] = (), online_learning: bool = True) -> dict[str, Any]:
    """`summary.json`: the learning headline first, then the numbers (`threads`: each process's `ThreadSetting`)."""
    from .report import learning_headline

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
        "headline": learning_headline(probes, schedule.num_published, schedule.num_rounds, schedule.alarms,
                                      online_learning),
        "wall_time_s": wall_s,
        "model_build_s": build_s,
        "steps": len(steps),
        "first_step": {k: first.get(k) for k in keys},
        "last_step": {k: last.get(k) for k in keys},
        "probe": drift,
        "learner": {**vars(schedule.times), **schedule.times.shares(), "events": len(schedule.events)},
        "speedup_vs_plain": speed.speedup,
        "threads": {t.process: {"intra_op": t.intra_op, "inter_op": t.inter_op, "OMP_NUM_THREADS": t.omp_num_threads}
                    for t in threads},
    }


def _report_to(report: Any) -> list[str]:
    """`GRPOConfig.report_to` from `report.report_to` (`ReportSettings`): as named ("none": nothing), or TensorBoard
    when it is installed."""
    if report.report_to is not None:
        return [name for name in report.report_to if name != "none"]
    return ["tensorboard"] if importlib.util.find_spec("tensorboard") is not None else []


def check_extras(data: Any, overrides: list[str]) -> None:
    """Before torch loads: the extras this run needs — TRL, Ray (the default backend), matplotlib (the report's
    plots), vLLM (`engine.kind: vllm`) — installed, or one `MissingExtra` line naming them (`specroll.extras`)."""
    from specroll.extras import require
    from specroll.integrations.yaml_config import with_overrides

    if isinstance(data, dict) and overrides:
        data = with_overrides(data, overrides)
    def kind(section: str, default: str) -> Any:
        fields = data.get(section) if isinstance(data, dict) else None
        return fields.get("kind", default) if isinstance(fields, dict) else default

    needs = {"trl": ("trl", "datasets"), "ray": ("ray",), "report": ("matplotlib",), "vllm": ("vllm",)}
    if kind("backend", "ray") != "ray":
        del needs["ray"]
    if kind("engine", "specroll") != "vllm":
        del needs["vllm"]
    require(needs, "specroll train")
