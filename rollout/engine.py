"""SpecEngine: batched speculative decoding with ragged acceptance and continuous batching.

Usage::

    engine = SpecEngine(target, drafter, EngineConfig(max_batch_size=16, gamma=4))
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=256, temperature=1.0), n=8)
    engine.release()   # the trainer trains in the KV cache's memory ...
    engine.allocate()  # ... and gives it back before the next rollout phase

The loop is nano-vllm's schedule → run → postprocess: the scheduler admits rows (`core.scheduler`) and the
speculation part plans each step (`engine_speculation.EngineSpeculation.plan`: γ, and a tree's width); a step
object runs it (`step/`: `step.chain.ChainStep`, `step.tree.TreeStep`, admitted rows through
`step.prefill.PrefillStep`); the policies learn from its report (`EngineSpeculation.observe`) and finished rows
make room. A chain step asks the drafter (any `drafters.protocol.Drafter`: the drafter LM, the suffix drafter, or a
per-row choice between them, as `EngineConfig.drafters` says) for up to γ tokens per live row, verifies them
with one target forward of γ + 1 tokens per row, and keeps a different number of tokens per row
(`sampling.accept.AcceptRule.verify`); `core.append.append_kept` appends them, then both caches roll back
to what was kept (`ModelRunner.rollback`, `Drafter.keep`). The target cache always holds every token of a
row but the last. With no drafter or γ = 0 the same loop is plain batched decoding — the fair baseline.
For a drafter that reads the target's features (`Drafter.wants_hidden`) the prefill and verification
forwards also write their last hidden states into `RowBuffers.hidden` (`drafters.hidden`). With
`EngineConfig.tree_width` the tree policy (`gamma.tree_shape`) may make a step a tree of γ levels of w candidates
instead, verified in one forward (`step.tree.TreeStep`: one device→host copy, as a chain step).

Memory: the target's attention K/V lives in dense per-slot buffers or, with `EngineConfig.kv_cache="paged"`,
in blocks taken as rows grow (`models.paged`; requests wait for free blocks, siblings share their prompt's
full blocks, `step.prefill`); `EngineConfig.memory_budget` is checked part by part before anything is
allocated (`models.memory`, `SpecEngine.memory`). `release` / `allocate` hand the caches' memory to a
colocated trainer between rollout phases (`engine_caches`).

The engine holds its parts and delegates its public methods to them: `caches` (`engine_caches`: memory),
`weights` (`engine_weights`: policy and drafter versions, the draft vocabulary), `speculation`
(`engine_speculation`: γ, trees, whether to draft). What it learnt while it ran is its `state_dict()`.

Randomness is per request and position (`sampling.randomness`): sample j of prompt i is keyed by the call's
seed and (prompt_indices[i], j), and every number it draws by its sequence position and purpose —
never by the step, slot, batch or γ schedule. `EngineConfig.sampler` picks the accept rule
(`sampling.accept`): with "invariant" a seed's tokens are plain decoding's whatever the drafter and γ.

Host↔device syncs. A steady-state step (no row finishing or admitted) makes one device→host copy:
`core.append.append_kept` folds everything the host needs — finished rows, new lengths, kept tokens,
accepted and verified drafts, stats, auto-γ's evidence — into one tensor. The caches plan their
forwards from host mirrors of their lengths (`models.cache`), random-number constants are Python ints,
so nothing else reads the device. A step that uses the suffix drafter's proposal adds one host→device
copy (its drafts, lengths and the model's rows, packed). With auto-γ on a GPU, every
`step.chain.DRAFT_TIMING_EVERY`-th drafting step adds one `torch.cuda.synchronize` to time its draft part. So:
1 per step for plain decoding, the model drafter, EAGLE, Medusa and layer-skip; 2 with the suffix
drafter's drafts (`tests/test_engine_syncs.py` counts them). Finishing rows cost their export's copies
and admitted rows their prefill's (the prompts, their slots), once per row, not per step.

Placement: with `EngineConfig.drafter_device` or `overlap` the drafter LM is an `placement.ahead.AheadDrafter`, on
its own device or cores; on a split CPU the engine keeps the target's threads on the other cores while it steps
(`placement.threads.TargetCores`: pinned at each step, given back at each yield), and with `overlap` a chain step
drafts the next one while the target verifies (`StepPlan.overlap`).

Faults stay in their row. A row whose target distribution is non-finite where its next token is
drawn ends with `finish_reason="error"` (its tokens before that position kept, `Rollout.error` says
where); a row whose drafter q is non-finite takes a plain step, counted in
`EngineStats.drafter_nonfinite_rows` and warned about once per call. Both are found by whole-tensor
checks folded into the step's one device→host copy; only a failing row costs a second one.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from .config import EngineConfig, SamplingParams
from .core.batch import RowBuffers
from .core.request import Request, Rollout, make_requests
from .core.scheduler import Scheduler
from .core.stats import EngineStats
from .core.validate import validate_generate_args
from .drafters.draft_vocab import DraftVocab
from .drafters.factory import DrafterWeights, initial_draft_vocab
from .drafters.protocol import Drafter
from .drafters.version import DrafterVersion
from .engine_caches import EngineCaches, plan_engine_memory
from .engine_speculation import STATE_PARTS as SPECULATION_PARTS
from .engine_speculation import EngineSpeculation
from .engine_weights import EngineWeights
from .gamma.factory import make_gamma_policy, make_tree_policy
from .gamma.policy import GammaPolicy, StepShape
from .gamma.speculation_gate import SpeculationGate
from .gamma.tree_shape import AutoWidth, FixedWidth
from .models.architectures import check_architecture
from .models.memory import MemoryPlan
from .models.paged import PagedLayout
from .models.runner import ModelRunner
from .models.vocab import check_vocab_compatible
from .placement.ahead import AheadDrafter, place_drafter
from .sampling.accept import ACCEPT_RULES, AcceptRule
from .sampling.randomness import draw_seed
from .step.chain import ChainStep
from .step.prefill import PrefillStep
from .step.tree import TreeStep, make_tree_step

__all__ = ["STATE_FORMAT", "SpecEngine", "engine_state", "load_engine_state"]
STATE_FORMAT = 1  # `SpecEngine.state_dict`'s layout


class SpecEngine:
    """Generates completions for many prompts at once with a target model and optional drafter."""

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: DrafterWeights | Drafter | None = None,
        config: EngineConfig | None = None,
        target_tokenizer=None,
        drafter_tokenizer=None,
    ):
        """`drafter`: a drafter LM or a head (`drafters.heads.EagleHead`, `drafters.heads.MedusaHeads`), wrapped
        as `config.drafters` says (by default as what it is: `drafters.factory`), any object implementing
        `Drafter` (used as given), or None (with `config.drafters` None: plain decoding)."""
        self.config = config = config or EngineConfig()
        if config.kind != "specroll":
            raise ValueError(f"engine.kind={config.kind!r} is invalid for SpecEngine (specroll's engine): build a "
                             "kind 'vllm' engine with specroll.integrations.vllm.VllmEngine")
        check_architecture(target, "target", config.allow_unverified_architectures)
        if isinstance(drafter, PreTrainedModel):
            check_architecture(drafter, "drafter", config.allow_unverified_architectures)
            check_vocab_compatible(target, drafter, target_tokenizer, drafter_tokenizer)
        self.device = torch.device(config.device)
        memory = plan_engine_memory(config, target, drafter)
        paged = None if memory.kv_blocks is None else PagedLayout(memory.kv_blocks, config.kv_block_size)
        self.target = ModelRunner(target, config.max_batch_size, config.cache_len, config.dtype, self.device,
                                  config.lean_forward, config.state_history, paged, config.prefill_chunk_tokens)
        self.vocab_size = self.target.vocab_size
        self.drafter: Drafter | None = place_drafter(drafter, config, self.target)
        self.target_cores = self.drafter.target_cores if isinstance(self.drafter, AheadDrafter) else None
        self.weights = EngineWeights(self.target, self.drafter, config.dtype)
        if config.draft_vocab is not None:
            self.weights.set_draft_vocab(initial_draft_vocab(config, self.vocab_size, target.config, drafter))
        self.caches = EngineCaches(config, memory, self.target, self.drafter)
        self.stats = EngineStats(trace_steps=config.stats_trace_steps)
        self._pin(True)  # on a split CPU auto-γ times the target on the cores it will run on
        try:
            gamma_policy = make_gamma_policy(config, self.target, self.drafter)
        finally:
            self._pin(False)
        self.tree_step: TreeStep | None = make_tree_step(config, self.target, self.drafter, self.stats)
        tree_policy = make_tree_policy(config, gamma_policy) if self.tree_step else None
        self.speculation = EngineSpeculation(config, self.drafter, self.stats, self.weights, gamma_policy, tree_policy)
        self.chain_step = ChainStep(self.target, self.drafter, self.stats, self.vocab_size,
                                    ACCEPT_RULES[config.sampler](), self.speculation)
        self.prefill_step = PrefillStep(self.target, self.drafter, config.max_step_drafts)
        self._drafting = False  # this generate call drafts (`speculating` at its start)
        self._generating = False

    # ------------------------------------------------------------------ public API

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, n: int = 1,
                 max_new_tokens: Sequence[int] | None = None,
                 prompt_indices: Sequence[int] | None = None) -> list[Rollout]:
        """Complete every prompt `n` times; results in input order, a prompt's n samples consecutive.

        `max_new_tokens`, if given, is a per-prompt budget (each in [1, params.max_new_tokens]).
        `prompt_indices[i]` (default i) is prompt i's index in the caller's whole batch: sample j of
        prompt i draws its random numbers as request (prompt_indices[i], j). So a batch cut into chunks
        (one per worker) or reordered, each prompt passed with its index, gives the tokens the whole
        batch gives in one call; the same index and seed give the same random numbers.
        """
        steps = self.generate_steps(prompts, params, n, max_new_tokens, prompt_indices)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def generate_steps(self, prompts: Sequence[Sequence[int]], params: SamplingParams, n: int = 1,
                       max_new_tokens: Sequence[int] | None = None,
                       prompt_indices: Sequence[int] | None = None) -> Generator[int, None, list[Rollout]]:
        """`generate` one engine step at a time: a generator that yields the live batch size after
        each step and returns the rollouts (`StopIteration.value`). Arguments are checked here, before
        the generator exists.

        Lets a caller interleave work between steps, or run several engines in lockstep (the
        benchmarks do, so that machine noise hits every contender alike). `stats.wall_time_s` counts
        only the time spent inside the generator.
        """
        if self.released:
            raise RuntimeError("generate called on a released engine (SpecEngine.release): call allocate() first")
        budgets, indices = validate_generate_args(prompts, params, n, self.vocab_size, self.config.max_seq_len,
                                                  max_new_tokens, prompt_indices)
        self.target.cache.check_fits([self.prefill_step.reserved_tokens(len(p), b) for p, b in zip(prompts, budgets)])
        seed = params.seed if params.seed is not None else draw_seed()  # once per call, recorded in each Rollout
        return self._run(make_requests(prompts, n, budgets, seed, indices), params)

    def state_dict(self) -> dict[str, Any]:
        """What this engine learnt from the rollouts it served, for a resumed run (plain data and int64 tensors;
        take it between `generate` calls): the speculation part's γ and tree statistics
        (`EngineSpeculation.state_dict`) and the drafter's parts (`Drafter.learnt_state`: the suffix drafter's
        history). Not in it: the cost model's calibration (measured again, or read from `calibration_cache`; the
        corrections go on adapting on whatever hardware the resumed run has), and the weights (the learner
        publishes them; the backends sync them). Speed only: a state never changes a token."""
        learnt = self.drafter.learnt_state() if self.drafter else {}
        return {"format": STATE_FORMAT, **self.speculation.state_dict(), **learnt}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back a `state_dict()` between `generate` calls. `ValueError` naming what differs where this engine's
        γ policy or drafter kinds are not the saved engine's."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"engine state format {state.get('format')!r} is invalid: {STATE_FORMAT} is read")
        # The rest is the drafter's; a part saved as None is one the saved engine's drafter did not have.
        saved = {key: value for key, value in state.items()
                 if key not in ("format", *SPECULATION_PARTS) and value is not None}
        parts = set(self.drafter.learnt_state() if self.drafter else ())
        if set(saved) != parts:
            raise ValueError(f"the saved engine's drafter kept {sorted(saved) or 'nothing'} and this one's keeps "
                             f"{sorted(parts) or 'nothing'}: engine.drafters must be the saved run's")
        self.speculation.load_state_dict(state)
        if saved:
            self.drafter.load_learnt_state(saved)

    # ------------------------------------------------------------------ the parts' public methods

    @property
    def memory(self) -> MemoryPlan:
        """The memory plan checked before anything was allocated (`models.memory`)."""
        return self.caches.memory

    @property
    def rows(self) -> RowBuffers | None:
        """The per-row buffers (None while released)."""
        return self.caches.rows

    @property
    def released(self) -> bool:
        """Whether `release` freed the caches (and `allocate` has not made them again)."""
        return self.caches.released

    def release(self) -> None:
        """Free the KV caches (target and drafter), recurrent state and per-row buffers between `generate`
        calls, so that a trainer colocated with the engine can use the memory; weights, the drafter's suffix
        history, stats and the cost model stay. `allocate` makes them again. On a GPU the memory goes back to
        torch's caching allocator (the trainer's next allocations reuse it; `torch.cuda.empty_cache()` hands
        it to the driver; on a CPU the host heap is trimmed, `models.memory.return_host_memory`). A released
        engine refuses `generate` (it does not re-allocate by itself: memory a colocated trainer may hold is not
        taken behind its back). Releasing twice is a no-op."""
        if self._generating:
            raise RuntimeError("release called while this engine is running a generation; finish or close it first")
        self.caches.release()

    def allocate(self) -> None:
        """Make what `release` freed again, zeroed (a no-op on an allocated engine)."""
        self.caches.allocate()

    def set_draft_vocab(self, vocab: DraftVocab | None) -> None:
        """`EngineWeights.set_draft_vocab`: draft over `vocab`'s target ids only (None: the whole vocabulary)."""
        self.weights.set_draft_vocab(vocab)

    def draft_vocab(self) -> torch.Tensor | None:
        """`EngineWeights.draft_vocab`: the target ids the drafter drafts over now [N] (None: all, or no drafter)."""
        return self.weights.draft_vocab()

    def update_target(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """`EngineWeights.update_target`: new policy weights between `generate` calls."""
        self.weights.update_target(named_tensors, version)

    def load_drafter(self, version: DrafterVersion) -> None:
        """`EngineWeights.load_drafter`: serve a published drafter version between `generate` calls."""
        self.weights.load_drafter(version)

    def served_drafter_digest(self, weights: torch.nn.Module) -> str:
        """`EngineWeights.served_drafter_digest`: the digest of the drafter `weights` this engine serves."""
        return self.weights.served_drafter_digest(weights)

    @property
    def policy_version(self) -> int:
        return self.weights.policy_version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self.weights.policy_version = version

    @property
    def drafter_version(self) -> int:
        return self.weights.drafter_version

    @drafter_version.setter
    def drafter_version(self, version: int) -> None:
        self.weights.drafter_version = version

    @property
    def drafter_acceptance(self) -> float | None:
        """The served drafter version's held-out acceptance, if it came with one."""
        return self.weights.drafter_acceptance

    @property
    def drafter_invariant_acceptance(self) -> float | None:
        """... its bound under the invariant sampler."""
        return self.weights.drafter_invariant_acceptance

    def break_even_acceptance(self) -> float | None:
        """`EngineSpeculation.break_even_acceptance`: per-draft acceptance below which speculation stops paying."""
        return self.speculation.break_even_acceptance()

    @property
    def speculating(self) -> bool:
        """`EngineSpeculation.speculating`: whether a generate call starting now drafts."""
        return self.speculation.speculating(self.break_even_acceptance)

    @property
    def gamma_policy(self) -> GammaPolicy:
        return self.speculation.gamma_policy

    @gamma_policy.setter
    def gamma_policy(self, policy: GammaPolicy) -> None:
        self.speculation.gamma_policy = policy

    @property
    def tree_policy(self) -> FixedWidth | AutoWidth | None:
        return self.speculation.tree_policy

    @property
    def speculation_gate(self) -> SpeculationGate:
        return self.speculation.gate

    @property
    def accept_rule(self) -> AcceptRule:
        """The chain step's accept rule (`EngineConfig.sampler`)."""
        return self.chain_step.rule

    @accept_rule.setter
    def accept_rule(self, rule: AcceptRule) -> None:
        self.chain_step.rule = rule

    # ------------------------------------------------------------------ the step loop

    def _run(self, requests: list[Request], params: SamplingParams) -> Generator[int, None, list[Rollout]]:
        if self._generating:  # one batch state per engine: two generations would corrupt each other
            raise RuntimeError("this engine is already running a generation; finish or close it first")
        self._generating = True
        try:
            return (yield from self._steps(requests, params))
        finally:
            self._generating = False
            self._pin(False)

    def _steps(self, requests: list[Request], params: SamplingParams) -> Generator[int, None, list[Rollout]]:
        started = time.perf_counter()
        self._pin(True)
        stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long, device=self.device)
        scheduler = Scheduler(self.config.max_batch_size, lambda req: self.target.cache.try_reserve(
            self.prefill_step.reserved_tokens(len(req.prompt_ids), req.max_new_tokens)))
        scheduler.add(requests)
        nonfinite_before = self.stats.drafter_nonfinite_rows
        self._drafting = self.drafter is not None and self.speculating
        tried_before, accepted_before = self.stats.tried, self.stats.accepted
        self._prefill(scheduler.admit(), scheduler)
        while not scheduler.done:
            plan = self.speculation.plan(self._shape(scheduler.num_live_rows), params.greedy, self._drafting)
            step = self.chain_step if plan.width == 1 else self.tree_step
            report = step.run(self.rows, plan, params, stop_ids)
            self.speculation.observe(report, params.greedy)
            self._finish(scheduler, report.summary.finished)
            self._pin(False)
            self._pause_clock(started)
            yield scheduler.num_live_rows
            started = time.perf_counter()
            self._pin(True)
        self._pause_clock(started)
        self._warn_nonfinite_drafter(self.stats.drafter_nonfinite_rows - nonfinite_before)
        if self._drafting:
            self.speculation.observe_call(self.stats.tried - tried_before, self.stats.accepted - accepted_before)
        return [req.rollout for req in requests]

    def _pin(self, on: bool) -> None:
        """Keep the target's threads on its cores while this engine steps (a split CPU: `drafter_device`)."""
        if self.target_cores is not None:
            self.target_cores.pin() if on else self.target_cores.unpin()

    def _shape(self, live: int) -> StepShape:
        """The live batch as an adaptive γ policy sees it (from the host copies; skipped for a fixed γ)."""
        if not (self.drafter and self.gamma_policy.adaptive):
            return StepShape(live)
        return StepShape.of_rows(self.rows.host_seq_len[:live], self.rows.host_max_len[:live], self.config.max_gamma)

    def _warn_nonfinite_drafter(self, rows: int) -> None:
        if rows > 0:
            warnings.warn(
                f"drafter version {self.drafter_version} gave non-finite draft probabilities (NaN/inf) in "
                f"{rows} row-steps of this generate call; their drafts were dropped (plain steps, output "
                "unaffected). Counted in EngineStats.drafter_nonfinite_rows.",
                RuntimeWarning, stacklevel=4,  # past _steps and _run: where the generator is stepped
            )

    def _pause_clock(self, started: float) -> None:
        self.stats.wall_time_s += time.perf_counter() - started
        self.stats.target_forwards = self.target.num_forwards
        self.stats.drafter_forwards = self.drafter.num_forwards if self.drafter else 0

    # ------------------------------------------------------------------ batch bookkeeping

    def _prefill(self, admitted: list[Request], scheduler: Scheduler) -> None:
        """Load admitted requests into their slots and fill both caches with all but the last token."""
        if not admitted:
            return
        self.prefill_step.run(self.rows, admitted, scheduler.running, self._drafting and self.config.gamma != 0)
        self.speculation.drafter_behind = True  # the next drafting step catches the drafter up on these prompts

    def _finish(self, scheduler: Scheduler, finished: list[int]) -> None:
        if not finished:
            return
        rows = self.rows
        for slot, row in zip(finished, rows.export(finished)):
            scheduler.running[slot].finish(row, self.policy_version, self.drafter_version)
        self.target.cache.release_rows(finished)
        plan = scheduler.retire(finished)
        for src, dst in plan.moves:
            rows.move_row(src, dst)
            self.target.cache.move_row(src, dst)
            if self.drafter:
                self.drafter.move_row(src, dst)
        self._prefill(plan.admitted, scheduler)


def engine_state(engine: SpecEngine) -> dict[str, Any]:
    """`engine.state_dict()`, the form the resume path (`integrations`, `specroll.jobs`) takes it in."""
    return engine.state_dict()


def load_engine_state(engine: SpecEngine, state: dict[str, Any]) -> None:
    """`engine.load_state_dict(state)`, the form the resume path takes it back in."""
    engine.load_state_dict(state)
