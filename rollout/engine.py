"""SpecEngine: batched speculative decoding with ragged acceptance and continuous batching.

Usage::

    engine = SpecEngine(target, drafter, EngineConfig(max_batch_size=16, gamma=4))
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=256, temperature=1.0), n=8)
    engine.release()   # the trainer trains in the KV cache's memory ...
    engine.allocate()  # ... and gives it back before the next rollout phase

Each step asks the drafter (any `drafters.protocol.Drafter`: the drafter LM, the suffix drafter, or a per-row
choice between them, as `EngineConfig.drafters` says) for up to γ tokens per live row, verifies them
with one target forward of γ + 1 tokens per row, and keeps a different number of tokens per row
(`sampling.accept.AcceptRule.verify`); `core.append.append_kept` appends them, then both caches roll back
to what was kept (`ModelRunner.rollback`, `Drafter.keep`). The target cache always holds every token of a
row but the last. With no drafter or γ = 0 the same loop is plain batched decoding — the fair baseline.
For a drafter that reads the target's features (`Drafter.wants_hidden`) the prefill and verification
forwards also write their last hidden states into `RowBuffers.hidden` (`drafters.hidden`). With
`EngineConfig.tree_width` the tree policy (`gamma.tree`) may make a step a tree of γ levels of w candidates
instead, verified in one forward (`tree_step.TreeStep`: one device→host copy, as a chain step).

Memory: the target's attention K/V lives in dense per-slot buffers or, with `EngineConfig.kv_cache="paged"`,
in blocks taken as rows grow (`models.paged`; requests wait for free blocks, siblings share their prompt's
full blocks, `prefill`); `EngineConfig.memory_budget` is checked part by part before anything is
allocated (`models.memory`, `SpecEngine.memory`). `release` / `allocate` hand the caches' memory to a
colocated trainer between rollout phases.

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
`DRAFT_TIMING_EVERY`-th drafting step adds one `torch.cuda.synchronize` to time its draft part. So:
1 per step for plain decoding, the model drafter, EAGLE, Medusa and layer-skip; 2 with the suffix
drafter's drafts (`tests/test_engine_syncs.py` counts them). Finishing rows cost their export's copies
and admitted rows their prefill's (the prompts, their slots), once per row, not per step.

Faults stay in their row. A row whose target distribution is non-finite where its next token is
drawn ends with `finish_reason="error"` (its tokens before that position kept, `Rollout.error` says
where); a row whose drafter q is non-finite takes a plain step, counted in
`EngineStats.drafter_nonfinite_rows` and warned about once per call. Both are found by whole-tensor
checks folded into the step's one device→host copy; only a failing row costs a second one.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Generator, Sequence

import torch
from transformers import PreTrainedModel

from .config import EngineConfig, SamplingParams
from .core.append import VerifiedStep, append_kept
from .core.batch import RowBuffers
from .core.request import Request, Rollout, make_requests
from .core.scheduler import Scheduler
from .core.stats import EngineStats
from .core.validate import validate_generate_args
from .drafters.factory import DrafterWeights, make_drafter
from .drafters.protocol import Drafter, Proposal
from .engine_memory import EngineMemory
from .engine_speculation import EngineSpeculation
from .engine_weights import ACCEPTANCE_STATE_KEY, VOCAB_DRAFTER_KINDS, EngineWeights
from .gamma.factory import make_gamma_policy
from .gamma.policy import GammaPolicy, StepOutcome, StepShape
from .gamma.speculation_gate import SpeculationGate
from .models.architectures import check_architecture
from .models.paged import PagedLayout
from .models.runner import ModelRunner
from .models.timing import runs_async
from .models.vocab import check_vocab_compatible
from .prefill import admits, check_blocks, prefill_target, reserved_tokens
from .sampling.accept import ACCEPT_RULES, AcceptRule
from .sampling.draft_q import DraftQ
from .sampling.logits import process_logits
from .sampling.noise import StepNoise
from .sampling.randomness import draw_seed
from .tree_step import make_tree_step

__all__ = ["ACCEPTANCE_STATE_KEY", "DRAFT_TIMING_EVERY", "VOCAB_DRAFTER_KINDS", "SpecEngine"]
DRAFT_TIMING_EVERY = 16  # on an async device, the drafting steps whose draft part auto-γ times (one sync each)


class SpecEngine(EngineMemory, EngineWeights, EngineSpeculation):
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
        slots, length = config.max_batch_size, config.cache_len
        self.memory = self._plan_memory(target, drafter)
        paged = None if self.memory.kv_blocks is None else PagedLayout(self.memory.kv_blocks, config.kv_block_size)
        self.target = ModelRunner(target, slots, length, config.dtype, self.device, config.lean_forward,
                                  config.state_history, paged, config.prefill_chunk_tokens)
        self.vocab_size = self.target.vocab_size
        self.drafter: Drafter | None = make_drafter(drafter, config, self.target)
        if config.draft_vocab is not None:
            self._first_draft_vocab(target, config.draft_vocab, drafter)
        wants_hidden = self.drafter is not None and self.drafter.wants_hidden
        self._hidden_size = self.target.hidden_width if wants_hidden else None
        self.rows: RowBuffers | None = self._row_buffers()
        self.stats = EngineStats(trace_steps=config.stats_trace_steps)
        self.gamma_policy: GammaPolicy = make_gamma_policy(config, self.target, self.drafter)
        self.accept_rule: AcceptRule = ACCEPT_RULES[config.sampler]()
        self.tree_step, self.tree_policy = make_tree_step(config, self.target, self.drafter, self.gamma_policy)
        self.policy_version = 0
        self.drafter_version = 0
        self.drafter_acceptance: float | None = None  # the served version's held-out acceptance, if it came with one
        self.drafter_invariant_acceptance: float | None = None  # ... its bound under the invariant sampler
        self.speculation_gate = SpeculationGate()  # "when_learned": that number, checked by what rollouts accept
        self._drafting = False  # this generate call drafts (`speculating` at its start)
        self._generating = False
        self._drafting_steps = 0
        self._drafter_behind = False  # rows were prefilled, or steps run plain, since the last drafting step

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
        check_blocks(self.target.cache, [reserved_tokens(len(p), b, self.config.max_step_drafts)
                                         for p, b in zip(prompts, budgets)])
        seed = params.seed if params.seed is not None else draw_seed()  # once per call, recorded in each Rollout
        return self._run(make_requests(prompts, n, budgets, seed, indices), params)

    def _run(self, requests: list[Request], params: SamplingParams) -> Generator[int, None, list[Rollout]]:
        if self._generating:  # one batch state per engine: two generations would corrupt each other
            raise RuntimeError("this engine is already running a generation; finish or close it first")
        self._generating = True
        try:
            return (yield from self._steps(requests, params))
        finally:
            self._generating = False

    def _steps(self, requests: list[Request], params: SamplingParams) -> Generator[int, None, list[Rollout]]:
        started = time.perf_counter()
        stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long, device=self.device)
        scheduler = Scheduler(self.config.max_batch_size, lambda req: admits(self.target.cache, self._reserve(req)))
        scheduler.add(requests)
        nonfinite_before = self.stats.drafter_nonfinite_rows
        self._drafting = self.drafter is not None and self.speculating
        tried_before, accepted_before = self.stats.tried, self.stats.accepted
        self._prefill(scheduler.admit(), scheduler)
        while not scheduler.done:
            shape = self._shape(scheduler.num_live_rows)
            gamma = self.gamma_policy.choose(shape, params.greedy) if self._drafting else 0
            depth, width = self.tree_policy.choose(shape, gamma, params.greedy) if self.tree_policy else (gamma, 1)
            finished = self._step(shape, gamma, params, stop_ids) if width == 1 else \
                self._tree(shape, depth, width, params, stop_ids)
            self._finish(scheduler, finished)
            self._pause_clock(started)
            yield scheduler.num_live_rows
            started = time.perf_counter()
        self._pause_clock(started)
        self._warn_nonfinite_drafter(self.stats.drafter_nonfinite_rows - nonfinite_before)
        if self._drafting and self.config.speculation == "when_learned":
            self.speculation_gate.observe(self.drafter_version, self._served_acceptance(),
                                          self.stats.tried - tried_before, self.stats.accepted - accepted_before)
        return [req.rollout for req in requests]

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

    # ------------------------------------------------------------------ the step

    def _step(self, shape: StepShape, gamma: int, params: SamplingParams, stop_ids: torch.Tensor) -> list[int]:
        n = shape.rows
        live = slice(0, n)
        started = time.perf_counter()
        # A copy, not a view: `append_kept` moves rows.seq_len, and the drafter rolls back to the old length.
        seq_len = self.rows.seq_len[live].clone()  # [n]
        noise = StepNoise(self.rows.keys[live], seq_len, gamma + 1, self.vocab_size, params.greedy)
        proposal = self._narrow(shape, self._propose(live, gamma, params, noise))
        if proposal.drafts.shape[1] < gamma:  # the last columns are not worth verifying
            gamma = proposal.drafts.shape[1]
            noise = noise.narrow(gamma + 1)
        drafted = self._draft_clock(gamma)
        usable = proposal.usable(gamma)  # [n, γ]
        last_token = self.rows.tokens[live].gather(1, (seq_len - 1)[:, None])  # [n, 1]
        logits = self.target.feed(live, torch.cat([last_token, proposal.drafts], dim=1),
                                  self.rows.hidden)  # [n, γ+1, V] in the target's dtype
        p = process_logits(logits, params)  # [n, γ+1, V] fp32
        verdict = self.accept_rule.verify(proposal.drafts, proposal.q, p, noise, usable)
        step = VerifiedStep(seq_len, proposal.drafts, proposal.lengths, proposal.source, usable, verdict, logits, p)
        summary = append_kept(self.rows, live, step, params, stop_ids, self.drafter.names if self.drafter else (),
                              count_evidence=bool(gamma) and self.gamma_policy.adaptive)
        self.target.rollback(live, self.rows.seq_len[live] - 1, [length - 1 for length in self.rows.host_seq_len[:n]])
        if self.drafter:
            self.drafter.keep(live, self.rows, seq_len, verdict.accepted_len, usable.sum(1))
        self.stats.record_step(gamma, n, summary, context=max(self.rows.host_seq_len[:n]))
        if self.gamma_policy.adaptive:
            self.gamma_policy.observe(shape, StepOutcome(
                gamma=gamma, rows=n, counts=summary.counts, emitted=summary.emitted, stopped=summary.stopped,
                seconds=time.perf_counter() - started, draft_seconds=None if drafted is None else drafted - started,
                catch_up=bool(gamma) and self._drafter_behind,
            ), params.greedy)
        self._drafter_behind = not gamma
        return summary.finished

    def _propose(self, live: slice, gamma: int, params: SamplingParams, noise: StepNoise) -> Proposal:
        n = live.stop
        if not gamma:
            return Proposal(torch.empty(n, 0, dtype=torch.long, device=self.device),
                            DraftQ(None, None, None, self.vocab_size))
        return self.drafter.propose(live, self.rows, gamma, params, noise.draw_draft)

    def _draft_clock(self, gamma: int) -> float | None:
        """When this step's drafting ended, for an adaptive γ policy's cost model (None: not measured).
        On a device that runs asynchronously the clock must wait for the drafts (a sync), so only every
        `DRAFT_TIMING_EVERY`-th drafting step is measured; the cost model takes the others' draft part as
        predicted from the measured ones (`CostModel.observe`). On a CPU every step is measured, free."""
        if not self.gamma_policy.adaptive:
            return None
        if gamma and runs_async(self.device):
            self._drafting_steps += 1
            if self._drafting_steps % DRAFT_TIMING_EVERY:
                return None
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _narrow(self, shape: StepShape, proposal: Proposal) -> Proposal:
        """The proposal cut to the width the γ policy finds worth verifying, if the drafter said what
        each width is expected to keep."""
        if proposal.expected_kept is None or not self.gamma_policy.adaptive:
            return proposal
        return proposal.narrow(self.gamma_policy.narrow(shape, proposal.expected_kept))

    def _tree(self, shape: StepShape, depth: int, width: int, params: SamplingParams, stop_ids: torch.Tensor
              ) -> list[int]:
        """A tree step (`tree_step.TreeStep`), counted and shown to the tree policy."""
        started, n = time.perf_counter(), shape.rows
        summary = self.tree_step.run(self.rows, n, depth, width, params, stop_ids)
        self.stats.record_step(depth, n, summary, context=max(self.rows.host_seq_len[:n]),
                               tree_nodes=n * depth * width)
        step = self.rows.last_step
        self.tree_policy.observe(shape, depth, width, step.accepted_len, step.drafted_len,
                                 time.perf_counter() - started, params.greedy)
        # The tree's drafter forwards moved no drafter length: the next chain step catches it up on the kept path
        # (up to depth + 1 tokens, not a chain's 1-2), a step auto-γ must not time (`_step`): timed, it made
        # drafting look dearer after every tree step (the draft scale is one number for every batch size).
        self._drafter_behind = True
        return summary.finished

    # ------------------------------------------------------------------ batch bookkeeping

    def _prefill(self, admitted: list[Request], scheduler: Scheduler) -> None:
        """Load admitted requests into their slots and fill both caches with all but the last token."""
        if not admitted:
            return
        for req in admitted:
            self.rows.load(req.slot, req.prompt_ids, req.max_new_tokens, req.key)
        slots, count = prefill_target(self.target, self.rows, admitted, scheduler.running,
                                      [self._reserve(req) for req in admitted])
        self._drafter_behind = True  # the next drafting step catches the drafter up on these prompts
        if self.drafter:  # an engine that never drafts lets the drafter catch up lazily, if ever
            drafts = self._drafting and self.config.gamma != 0
            self.drafter.prefill(slots, self.rows, count if drafts else torch.zeros_like(count))

    def _reserve(self, req: Request) -> int:
        return reserved_tokens(len(req.prompt_ids), req.max_new_tokens, self.config.max_step_drafts)

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
