"""VllmEngine: rollouts on vLLM (`vllm.LLM`), with specroll's sampling contract, weight refit and drafter checks.

    engine = VllmEngine.from_models(target, drafter, EngineConfig(gamma=3, drafters=("model",)))
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=128, temperature=1.0), n=8)
    engine.update_target(policy.state_dict(), version=1)      # the policy after a trainer step, in place
    engine.load_drafter(DrafterVersion(1, drafter.state_dict()))  # a published drafter, digest-checked

The same `Rollout`s as specroll's engine (`SpecEngine`): token ids, the target's log-probability of each token
under the processed distribution (vLLM's `processed_logprobs`), the finish reason, and per rollout how many drafts
were proposed and kept. Sampling: T, top-k, top-p, stop ids and the budget map one to one; sample j of prompt i
is its own vLLM request seeded from (seed, prompt_indices[i], j) (`sampling.randomness.request_keys`), so a
rollout's tokens do not depend on the batch it ran in. What vLLM cannot honour — the invariant sampler, token
trees, several drafters at once, a drafter kind without a vLLM proposer (`proposers`) — is refused when the
engine is built, naming the setting.

Weights go in place through specroll's worker extension (`worker_extension`, over `collective_rpc`): a policy
sync after every trainer step, a drafter version after every publish — its bytes checked against its digest on
arrival, its names against the whole drafter's — and `served_drafter_digests()` says, per worker, which version
each really serves (None: lost). `release` / `allocate` are vLLM's sleep / wake on a GPU; vLLM's CPU build has
no sleep mode (both are no-ops there, the KV cache stays).

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so rollouts and weights cross no process
boundary. The acceptance statistics are the rollouts' own (vLLM's per-request spec-decode metrics): vLLM's
`vllm:spec_decode_*` counters live in one registry per process, shared by every engine in it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import PreTrainedModel

from specroll.rollout import EngineConfig, Rollout, SamplingParams
from specroll.rollout.core.stats import EngineStats
from specroll.rollout.core.validate import validate_generate_args
from specroll.rollout.drafters.version import DrafterVersion
from specroll.rollout.models.weights import copy_into
from specroll.rollout.sampling.randomness import draw_seed, request_keys

from ..formats.files import read_safetensors
from . import cpu_fixes, kernel_scan
from .gamma import GammaSchedule
from .proposers import drafter_kind, speculative_config
from .refusals import check_cpu_proposer, check_engine_config, check_head_sizes
from .settings import VllmSettings
from .signals import TargetSignals

logger = logging.getLogger(__name__)
EXTENSION = "specroll.integrations.vllm.worker_extension.SpecrollWorkerExtension"
SEED_MASK = (1 << 63) - 1


class VllmEngine:
    """Generates with one in-process `vllm.LLM` (see the module doc)."""

    def __init__(self, target_dir: str, drafter_dir: str | None = None, config: EngineConfig | None = None,
                 settings: VllmSettings | None = None, tokenizer_dir: str | None = None,
                 drafter: DrafterVersion | None = None, signals: TargetSignals | None = None):
        """`target_dir` / `drafter_dir`: Hugging Face folders (the drafter's in the layout its kind's vLLM proposer
        loads). `drafter`: the version those drafter weights are (loaded again through the worker extension, so
        that what each worker serves is on record from the start; None: the folder's weights as version 0).
        `signals`: with `config.record_signals`, what records the learner's signals (vLLM records none)."""
        self.config = config = config or EngineConfig()
        self.settings = settings = settings or VllmSettings()
        check_engine_config(config)
        if config.record_signals and signals is None:
            raise ValueError("record_signals=True on a vLLM engine needs a TargetSignals (a Hugging Face copy of the "
                             "policy that records them: VllmEngine.from_models builds one)")
        self.signals = signals
        self.kind = drafter_kind(config)
        _set_environment(settings)
        check_cpu_proposer(self.kind)
        check_head_sizes(target_dir, drafter_dir if self.kind == "model" else None)
        from vllm import LLM

        spec = speculative_config(self.kind, drafter_dir, config)
        self.llm = LLM(
            model=target_dir, tokenizer=tokenizer_dir or target_dir, skip_tokenizer_init=tokenizer_dir is None,
            dtype=_dtype_name(config.dtype), max_model_len=config.max_seq_len, max_num_seqs=config.max_batch_size,
            enforce_eager=settings.enforce_eager, gpu_memory_utilization=settings.gpu_memory_utilization,
            logprobs_mode="processed_logprobs", worker_extension_cls=EXTENSION,
            speculative_config=spec, enable_sleep_mode=torch.cuda.is_available() and settings.sleep_level > 0,
            **({"per_request_spec_decode_metrics": "summary"} if spec else {}),
        )
        self.repaired_cpu_defect = any(r["defective"] for r in self.llm.collective_rpc("specroll_cpu_fix"))
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.wire_dtype = _dtype_name(config.dtype)
        self.drafter_names = _checkpoint_names(drafter_dir) if spec and self.kind != "suffix" else None
        self.policy_version = 0
        self.drafter_version = 0
        self.drafter_acceptance: float | None = None
        self.stats = EngineStats()
        self.released = False
        self.gamma_schedule: GammaSchedule | None = None  # gamma: auto — drafts per live batch size (`gamma`)
        self.gamma_schedule_version = 0  # the drafter version its acceptance evidence is of
        self.last_rows = config.max_batch_size
        if self.drafter_names is not None:
            self.load_drafter(drafter or DrafterVersion(0, read_safetensors(drafter_dir, "drafter folder")))
        if spec and config.gamma == "auto":
            started = time.perf_counter()
            self.gamma_schedule = GammaSchedule.calibrate(self.llm, config.max_gamma, config.max_batch_size,
                                                          self.vocab_size, prior=self.drafter_acceptance)
            logger.info("vLLM step costs timed for gamma: auto in %.1f s: %s", time.perf_counter() - started,
                        self.gamma_schedule.times.to_dict())

    @classmethod
    def from_models(cls, target: PreTrainedModel, drafter: PreTrainedModel | None = None,
                    config: EngineConfig | None = None, settings: VllmSettings | None = None, tokenizer=None,
                    folder: str | None = None) -> VllmEngine:
        """Save `target` (and the drafter LM, `tokenizer` if given) under `folder` (a temporary one by default,
        removed with the engine) and build the engine on them. With `config.record_signals`, `target` itself records
        the learner's signals (`TargetSignals`) and follows every `update_target`."""
        keep = tempfile.TemporaryDirectory(prefix="specroll-vllm-") if folder is None else None
        root = Path(folder or keep.name)
        target.save_pretrained(root / "target")
        if tokenizer is not None:
            tokenizer.save_pretrained(root / "target")
        drafter_dir = None
        if drafter is not None:
            drafter.save_pretrained(root / "drafter")
            drafter_dir = str(root / "drafter")
        config = config or EngineConfig()
        if drafter is not None and config.drafters is None:  # a drafter LM passed as itself, as SpecEngine takes it
            config = dataclasses.replace(config, drafters=("model",))
        signals = TargetSignals(target, config.signal_top_k) if config.record_signals else None
        engine = cls(str(root / "target"), drafter_dir, config, settings,
                     tokenizer_dir=str(root / "target") if tokenizer is not None else None, signals=signals)
        engine._folder = keep
        return engine

    @classmethod
    def from_paths(cls, models, target: PreTrainedModel, config: EngineConfig,
                   settings: VllmSettings | None = None) -> VllmEngine:
        """The engine on a run's saved folders (`model_source.ModelPaths`, as a Ray rollout worker has them): the
        target's, and the drafter LM's for `drafters: [model]` or an EAGLE-3 checkpoint folder (`models.head`) for
        `[eagle3]`. `target`: the Hugging Face copy that records the learner's signals with `config.record_signals`
        (and follows every `update_target`)."""
        config = config if config.drafters is not None or not models.drafter else dataclasses.replace(
            config, drafters=("model",))
        kind = drafter_kind(config)
        drafter_dir = {"model": models.drafter, "eagle3": models.head}.get(kind) if kind else None
        if kind == "eagle3" and not (drafter_dir and Path(drafter_dir).is_dir()):
            raise ValueError(f"models.head={models.head!r} is invalid with engine.kind: vllm and drafters: [eagle3]: "
                             "vLLM loads an EAGLE-3 checkpoint folder (the speculators layout `specroll distill` and "
                             "`specroll export` write)")
        if config.record_signals and kind == "eagle3":
            raise ValueError("an online EAGLE-3 learner on vLLM rollout workers is not built: its signals need the "
                             "target's fused hidden states on the workers; use backend.kind: local with engine.kind: "
                             "vllm, or a drafter LM (drafters: [model])")
        signals = TargetSignals(target, config.signal_top_k) if config.record_signals else None
        return cls(models.target, drafter_dir, config, settings, signals=signals)

    # ------------------------------------------------------------------ rollouts

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, n: int = 1,
                 max_new_tokens: Sequence[int] | None = None,
                 prompt_indices: Sequence[int] | None = None) -> list[Rollout]:
        """Complete every prompt `n` times; results in input order, a prompt's n samples consecutive. Arguments
        as `SpecEngine.generate` (checked the same way, before vLLM sees them)."""
        if self.released:
            raise RuntimeError("generate called on a released engine (VllmEngine.release): call allocate() first")
        budgets, indices = validate_generate_args(prompts, params, n, self.vocab_size, self.config.max_seq_len,
                                                  max_new_tokens, prompt_indices)
        from vllm.inputs import TokensPrompt

        seed = params.seed if params.seed is not None else draw_seed()
        keys = request_keys(seed, torch.tensor(indices, dtype=torch.long).repeat_interleave(n),
                            torch.arange(n).repeat(len(prompts))).tolist()
        requests = [TokensPrompt(prompt_token_ids=list(map(int, p))) for p in prompts for _ in range(n)]
        sampling = [_vllm_params(params, budgets[i], keys[i * n + j]) for i in range(len(prompts)) for j in range(n)]
        self.last_rows = min(len(requests), self.config.max_batch_size)
        if self.gamma_schedule is not None:
            before = self.gamma_schedule.ranges()
            if self.gamma_schedule.apply(self.llm) and self.gamma_schedule.ranges() != before:
                logger.info("vLLM drafts per live batch size (rows from, to, k) at acceptance %.3f: %s",
                            self.gamma_schedule.alpha(), self.gamma_schedule.ranges())
        started = time.perf_counter()
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        wall = time.perf_counter() - started
        rollouts = [self._rollout(out, prompts[r // n], seed, indices[r // n], r % n)
                    for r, out in enumerate(outputs)]
        metrics = [out.outputs[0].spec_decode_metrics for out in outputs]
        verify_steps = sum(sum(m.histogram) for m in metrics if m is not None)
        self._count(rollouts, verify_steps, wall)
        if self.gamma_schedule is not None:
            self.gamma_schedule.observe(sum(r.num_drafted for r in rollouts), sum(r.num_accepted for r in rollouts),
                                        verify_steps)
        if self.signals is not None:
            self.signals.record(rollouts, params)
        return rollouts

    def _rollout(self, output, prompt: Sequence[int], seed: int, prompt_index: int, sample_index: int) -> Rollout:
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for token, step in zip(ids, completion.logprobs or [])]
        metrics = completion.spec_decode_metrics
        accepted = 0 if metrics is None else sum(j * c for j, c in enumerate(metrics.histogram))
        return Rollout(prompt_ids=list(map(int, prompt)), completion_ids=ids, logprobs=logprobs,
                       finish_reason="stop" if completion.finish_reason == "stop" else "length",
                       num_drafted=0 if metrics is None else int(metrics.num_draft_tokens), num_accepted=int(accepted),
                       policy_version=self.policy_version, drafter_version=self.drafter_version, seed=seed,
                       prompt_index=prompt_index, sample_index=sample_index)

    # ------------------------------------------------------------------ weights

    def update_target(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new policy weights (all or some parameters, by their Hugging Face names) in place."""
        self.llm.collective_rpc("specroll_load", args=("target", dict(named_tensors)))
        self.llm.reset_prefix_cache()  # cached prompt K/V were computed by the old policy
        if self.signals is not None:
            copy_into(self.signals.model, named_tensors, "target")
        self.policy_version = version

    def load_drafter(self, version: DrafterVersion) -> None:
        """Serve `version`: its weights in place in every worker's proposer, checked against its digest and the
        drafter's names on arrival (a mismatch raises, and the served version stays as it was)."""
        if self.drafter_names is None:
            raise ValueError(f"load_drafter called on a vLLM engine whose drafter ({self.kind!r}) has no weights")
        if version.draft_vocab is not None and self.kind == "model":
            raise ValueError("a drafter version with a draft vocabulary cannot be served by vLLM's draft-model "
                             "proposer (it drafts over the whole vocabulary): serve draft vocabularies with "
                             "drafters: [eagle3], whose d2t/t2d carry them")
        self.llm.collective_rpc("specroll_load", args=("drafter", dict(version.weights)),
                                kwargs={"digest": version.digest(), "expected_names": self.drafter_names})
        self.llm.reset_prefix_cache()
        self.drafter_version = version.number
        self.drafter_acceptance = version.acceptance
        if self.gamma_schedule is not None and version.number != self.gamma_schedule_version:
            # a new drafter: its acceptance starts from what its version recorded, not from the last one's steps
            self.gamma_schedule.reset(version.acceptance if version.acceptance is not None
                                      else self.gamma_schedule.alpha())
        self.gamma_schedule_version = version.number

    def served_drafter_digests(self) -> list[str | None]:
        """Per worker, the digest of the drafter version it serves (`DrafterVersion.digest()`), None where what it
        loaded is no longer there."""
        return self.llm.collective_rpc("specroll_served", args=("drafter",))

    @property
    def drafter_invariant_acceptance(self) -> float | None:
        """None: vLLM verifies with the rejection rule only (`SpecEngine`'s is the invariant sampler's bound)."""
        return None

    def draft_vocab(self) -> torch.Tensor | None:
        """The target ids the drafter drafts over (None: the whole vocabulary)."""
        return None

    def break_even_acceptance(self) -> float | None:
        """With gamma: auto, the acceptance below which no number of drafts pays at the last call's live batch size
        (vLLM's measured step costs); None with a fixed gamma."""
        return None if self.gamma_schedule is None else self.gamma_schedule.break_even(self.last_rows)

    # ------------------------------------------------------------------ memory

    def release(self) -> None:
        """vLLM's sleep (`VllmSettings.sleep_level`) on a GPU, so a colocated trainer can use the memory; a no-op
        on a CPU (vLLM's CPU build has no sleep mode). Between `release` and `allocate` `generate` refuses."""
        if not self.released and torch.cuda.is_available() and self.settings.sleep_level > 0:
            self.llm.sleep(level=self.settings.sleep_level)
        self.released = True

    def allocate(self) -> None:
        """Wake what `release` put to sleep; the drafter's digests are checked by the caller afterwards."""
        if self.released and torch.cuda.is_available() and self.settings.sleep_level > 0:
            self.llm.wake_up()
        self.released = False

    # ------------------------------------------------------------------ counters

    def _count(self, rollouts: list[Rollout], verify_steps: int, wall: float) -> None:
        """Add a call to `stats` from its rollouts' own counts (vLLM's Prometheus counters are one registry per
        process, shared by every engine in it: not this engine's)."""
        stats = self.stats
        stats.generated_tokens += sum(len(r.completion_ids) for r in rollouts)
        stats.drafted += sum(r.num_drafted for r in rollouts)
        stats.accepted += sum(r.num_accepted for r in rollouts)
        stats.spec_row_steps += verify_steps  # a request's verify steps
        stats.wall_time_s += wall


def _vllm_params(params: SamplingParams, budget: int, key: int):
    from vllm import SamplingParams as VllmSamplingParams

    return VllmSamplingParams(
        n=1, temperature=float(params.temperature), top_k=params.top_k if params.top_k > 0 else -1,
        top_p=float(params.top_p), max_tokens=budget, stop_token_ids=list(params.stop_token_ids), ignore_eos=True,
        seed=key & SEED_MASK, logprobs=0, detokenize=False,
    )


def _set_environment(settings: VllmSettings) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.kv_cache_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", settings.omp_threads_bind)
    cpu_fixes.apply()
    kernel_scan.apply()


def _dtype_name(dtype: torch.dtype | str) -> str:
    return str(dtype).removeprefix("torch.")


def _weight_files(folder: str) -> list[Path]:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no .safetensors weights: save the drafter with save_pretrained")
    return files


def _checkpoint_names(folder: str | None) -> list[str] | None:
    if folder is None:
        return None
    names: list[str] = []
    for path in _weight_files(folder):
        with safe_open(str(path), "pt") as f:
            names += list(f.keys())
    return names
