"""Drafts per step on vLLM, per live batch size, from vLLM's own measured step costs and the drafter's acceptance.

    schedule = GammaSchedule.calibrate(llm, max_gamma=4, max_rows=64)   # vLLM's step seconds at (rows, k)
    schedule.observe(drafted, accepted, steps)                          # after each call, from its rollouts
    schedule.apply(llm)                                                 # k for every live batch size, 0 where none pays

vLLM's scheduler drafts `num_speculative_tokens_per_batch_size[rows]` tokens in a step with that many live
requests: a schedule vLLM fixes when it starts and never moves with acceptance. specroll's engine chooses γ per step
from its calibrated cost model (`rollout.gamma`); its costs are its own runner's, not vLLM's, so here the same
choice is made on vLLM's: `calibrate` times vLLM's steps at each (live rows, k) on the grid below — real steps of
the served models through the engine, the first steps of each run dropped — and `apply` gives every batch size the
k that emits the most tokens per second at the current acceptance, with independent per-draft acceptance α:
(1 − α^(k+1)) / (1 − α) tokens a row per step of `seconds[rows][k]` (the model `break_even_acceptance` uses). k = 0
(plain decoding) where no k beats it. The engine runs in this process, so `apply` replaces the scheduler's dense
lookup (the table vLLM builds from the configured ranges) before every call: the schedule follows acceptance as it
moves — a drafter that learns gets more drafts, one that falls behind gets fewer, down to none.

α is estimated from the rollouts' own counts (vLLM's per-request spec-decode metrics: drafts, kept drafts, verify
steps), decayed per call (also by calls that drafted nothing, so a k = 0 schedule is tried again once the evidence
against it has faded); with k drafts a step keeps α + … + α^k on average, solved for α at the calls' mean k. The
prior — the served drafter version's recorded acceptance, else `PRIOR_ACCEPTANCE` — keeps a few steps' weight.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from specroll.rollout.core.rates import PRIOR_ACCEPTANCE
from specroll.rollout.gamma.break_even import break_even_acceptance, expected_tokens

ROWS_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # live batch sizes timed (up to the engine's max_num_seqs)
STEPS = 10  # decode steps timed per (rows, k), after the prefill and WARMUP_STEPS decode steps
WARMUP_STEPS = 2
MAX_PREFILL_STEPS = 64
PROMPT_TOKENS = 32
DECAY = 0.7  # weight of the evidence so far when a call's counts are added (memory of a few calls)
PRIOR_STEPS = 8.0  # verify steps' worth of weight the prior keeps beside the measured counts


@dataclass
class StepTimes:
    """vLLM's measured step seconds: `seconds[i][k]` with `rows[i]` live requests drafting k tokens each."""

    rows: list[int]
    seconds: list[list[float]]

    def at(self, rows: int) -> list[float]:
        """Step seconds for k = 0..max at `rows` live requests: piecewise linear between the timed batch sizes,
        the nearest two extended past either end (never below 0)."""
        grid = self.rows
        if len(grid) == 1:
            return list(self.seconds[0])
        i = max(0, min(len(grid) - 2, next((j - 1 for j, r in enumerate(grid) if r >= rows), len(grid) - 2)))
        lo, hi = grid[i], grid[i + 1]
        w = (rows - lo) / (hi - lo)
        return [max(1e-9, a + w * (b - a)) for a, b in zip(self.seconds[i], self.seconds[i + 1])]

    def to_dict(self) -> dict:
        return {"rows": list(self.rows), "seconds": [list(s) for s in self.seconds]}


def best_k(step_seconds: list[float], alpha: float) -> int:
    """The k (0..len − 1) that emits the most tokens per second at these step costs and acceptance."""
    rates = [expected_tokens(alpha, k) / t for k, t in enumerate(step_seconds)]
    return max(range(len(rates)), key=lambda k: (rates[k], -k))


def alpha_from_counts(accepted_per_step: float, mean_k: float) -> float:
    """The per-draft acceptance α at which a step with `mean_k` drafts keeps `accepted_per_step` on average."""
    if mean_k <= 0:
        return 0.0
    kept = min(max(accepted_per_step, 0.0), mean_k)
    whole = max(1, round(mean_k))
    if kept >= whole:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** j for j in range(1, whole + 1)) < kept else (lo, mid)
    return (lo + hi) / 2


@dataclass
class GammaSchedule:
    """Chooses vLLM's drafts per live batch size (module doc). `max_gamma`: vLLM's num_speculative_tokens (the
    most any batch size gets); `max_rows`: its max_num_seqs."""

    times: StepTimes
    max_gamma: int
    max_rows: int
    prior: float = PRIOR_ACCEPTANCE
    drafted: float = 0.0
    accepted: float = 0.0
    steps: float = 0.0
    lookup: list[int] = field(default_factory=list)  # the last applied: lookup[rows] = k (index 0 unused)

    @classmethod
    def calibrate(cls, llm, max_gamma: int, max_rows: int, vocab_size: int, prior: float | None = None,
                  ) -> GammaSchedule:
        """Time vLLM's steps on `llm` (built with a per-batch-size schedule, so its scheduler has the lookup this
        replaces) at every grid batch size up to `max_rows` and every k in 0..max_gamma."""
        scheduler = _scheduler(llm)
        grid = [r for r in ROWS_GRID if r <= max_rows] or [max_rows]
        if grid[-1] != max_rows and max_rows not in ROWS_GRID:
            grid.append(max_rows)
        seconds = []
        for rows in grid:
            seconds.append([_time_steps(llm, scheduler, rows, k, vocab_size) for k in range(max_gamma + 1)])
        return cls(StepTimes(grid, seconds), max_gamma, max_rows,
                   prior=PRIOR_ACCEPTANCE if prior is None else float(prior))

    def alpha(self) -> float:
        """The current per-draft acceptance estimate: the measured one, weighed with the prior as `PRIOR_STEPS`
        verify steps (the prior alone until drafts were measured)."""
        if self.steps <= 0 or self.drafted <= 0:
            return self.prior
        measured = alpha_from_counts(self.accepted / self.steps, self.drafted / self.steps)
        return (self.steps * measured + PRIOR_STEPS * self.prior) / (self.steps + PRIOR_STEPS)

    def observe(self, drafted: int, accepted: int, steps: int) -> None:
        """Add one call's counts: drafts proposed, kept, and speculative verify steps (requests × steps). A call
        that drafted nothing (every batch size at k = 0) still decays the evidence: where acceptance measured too
        low for any k, it fades back to the prior within tens of calls and drafting is tried again — else one
        bad spell (a drafter behind the policy, greedy calls on a pair that only agrees when sampling) would turn
        speculation off for good."""
        self.drafted = DECAY * self.drafted + drafted
        self.accepted = DECAY * self.accepted + accepted
        self.steps = DECAY * self.steps + steps

    def reset(self, prior: float | None = None) -> None:
        """Forget the measured acceptance (a new drafter version is served): start again from `prior`."""
        self.drafted = self.accepted = self.steps = 0.0
        if prior is not None:
            self.prior = float(prior)

    def choose(self) -> list[int]:
        """lookup[rows] = k for rows 1..max_rows (index 0 unused, as vLLM's scheduler reads it)."""
        alpha = self.alpha()
        return [0] + [min(self.max_gamma, best_k(self.times.at(rows), alpha)) for rows in range(1, self.max_rows + 1)]

    def apply(self, llm) -> list[int]:
        """Choose, and hand the choice to `llm`'s scheduler; the lookup applied."""
        self.lookup = self.choose()
        _scheduler(llm).dynamic_sd_lookup = list(self.lookup)
        return self.lookup

    def ranges(self) -> list[tuple[int, int, int]]:
        """The last applied lookup as vLLM's ranges: [(first rows, last rows, k), ...]."""
        out: list[tuple[int, int, int]] = []
        for rows, k in enumerate(self.lookup[1:], start=1):
            if out and out[-1][2] == k:
                out[-1] = (out[-1][0], rows, k)
            else:
                out.append((rows, rows, k))
        return out

    def break_even(self, rows: int) -> float:
        """The acceptance below which no k pays at `rows` live requests (`break_even_acceptance`)."""
        return break_even_acceptance(self.times.at(max(1, min(rows, self.max_rows))))


def initial_ranges(max_gamma: int, max_rows: int) -> list[tuple[int, int, int]]:
    """The schedule vLLM starts with (every batch size at `max_gamma`), replaced by `GammaSchedule.apply`."""
    return [(1, max_rows, max_gamma)]


def _scheduler(llm):
    """The in-process engine's scheduler (VLLM_ENABLE_V1_MULTIPROCESSING=0, as `VllmEngine` runs it)."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None or not hasattr(scheduler, "dynamic_sd_lookup"):
        raise RuntimeError("gamma: auto on vLLM needs its scheduler in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) "
                           "and a vLLM with per-batch-size speculation (num_speculative_tokens_per_batch_size)")
    if scheduler.dynamic_sd_lookup is None:
        raise RuntimeError("the vLLM engine was built without num_speculative_tokens_per_batch_size: its scheduler "
                           "has no per-batch-size lookup to set")
    return scheduler


def _time_steps(llm, scheduler, rows: int, k: int, vocab_size: int) -> float:
    """Median seconds of a decode step with `rows` live requests drafting k tokens each (T = 1, as GRPO samples):
    only steps that began with every request decoding count, after `WARMUP_STEPS` of them."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    max_len = llm.llm_engine.model_config.max_model_len
    prompt_len = min(PROMPT_TOKENS, max_len // 4)
    saved = list(scheduler.dynamic_sd_lookup)
    scheduler.dynamic_sd_lookup = [k] * len(saved)
    ids = [f"specroll-gamma-{rows}-{k}-{i}" for i in range(rows)]
    seconds: list[float] = []
    try:
        for i, request in enumerate(ids):
            prompt = [(7 * i + 13 * j + 1) % vocab_size for j in range(prompt_len)]
            engine.add_request(request, TokensPrompt(prompt_token_ids=prompt),
                               SamplingParams(temperature=1.0, max_tokens=max_len - prompt_len, ignore_eos=True,
                                              seed=i, detokenize=False))
        for _ in range(MAX_PREFILL_STEPS + WARMUP_STEPS + STEPS):
            decoding = len(scheduler.running) == rows and all(r.num_output_tokens >= 1 for r in scheduler.running)
            started = time.perf_counter()
            engine.step()
            if decoding:
                seconds.append(time.perf_counter() - started)
            elif seconds:  # a request finished: the batch is no longer `rows` live
                break
            if len(seconds) == WARMUP_STEPS + STEPS:
                break
    finally:
        engine.abort_request(ids)
        while engine.has_unfinished_requests():
            engine.step()
        scheduler.dynamic_sd_lookup = saved
    if len(seconds) <= WARMUP_STEPS:
        raise ValueError(f"engine.max_seq_len={max_len} is too short to time vLLM's decode steps for gamma: auto "
                         f"({rows} rows, {k} drafts a step): at least {prompt_len + (WARMUP_STEPS + 2) * (k + 1) + 1}")
    return statistics.median(seconds[WARMUP_STEPS:])
