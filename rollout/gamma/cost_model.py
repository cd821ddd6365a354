"""Forward-time cost model measured on the running hardware, for choosing γ.

`CostModel` interpolates the calibrated grids (`calibration.calibrate`) piecewise-linearly: the target's forward
by live batch size, query length and KV length, the drafter's drafts, and the sampling of each verified position
(`models.timing.SamplingTimes`). The engine then refines it online from the steps it runs (`CostModel.observe`):
a measured slow-down of the drafts and a measured per-step overhead on top of the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..models.timing import CALIBRATION_CONTEXT, ForwardTimes, SamplingTimes

OFFSET_MEMORY = 100  # steps (at one batch size) over which a per-γ overhead offset fades when γ is not run


@dataclass
class CostModel:
    """Predicted step times: the target's forward (interpolated in the KV length between the two
    calibrated contexts) plus the step's measured overhead, and γ drafter forwards times their
    measured slow-down.

    Measured on this project's CPU (demo models), a step differs from its calibrated forwards in two
    ways that do not share one factor: each draft costs ~2× its calibrated forward at every batch
    size and γ (a small model's weights and activations fall out of the caches while the target
    runs), while the verification part costs its forward plus a per-step overhead that hardly
    depends on γ (+4–9 ms at 1 row, +11–16 ms at 16: sampling, verification, bookkeeping, colder
    weights). One factor for the whole step made each extra query token look up to 1.4× dearer than
    it is and the policy drafted too little; hence a multiplicative correction for the drafts and an
    additive one, per live batch size, for the rest. (The first draft of a step is now calibrated right after a
    target forward, `models.timing.after_a_target_forward`, so the slow-down left to learn is smaller: 1.15 where
    it was 1.33 in a replay of the subword demo's engine.)

    Part of that rest grows with γ and is calibrated (`sampling`, `sampling_time`): each verified position past
    the first has its logits processed and, under the invariant sampler, its Gumbel noise hashed (subword demo,
    32 rows: ~9 ms a position against a 145 ms forward at γ = 2). Left to the learnt overhead, whose prior before
    any speculative step is the plain steps' (one position), it made the first break-even 0.33-0.36 where the
    steps then measured 0.47-0.73, and a `when_learned` engine turned speculation on too early.
    """

    target: ForwardTimes  # at `contexts[0]` tokens already cached
    drafter: ForwardTimes
    target_long: ForwardTimes | None = None  # at `contexts[1]`; None: context-independent
    contexts: tuple[int, int] = (CALIBRATION_CONTEXT, CALIBRATION_CONTEXT)
    draft_scale: float | None = None  # measured / calibrated drafting time; None until measured
    overhead: dict[int, float] = field(default_factory=dict)  # live rows → step seconds beyond the forwards (γ ≥ 1)
    plain_overhead: dict[int, float] = field(default_factory=dict)  # live rows → the same of plain steps (γ = 0)
    overhead_offsets: dict[int, list[float]] = field(default_factory=dict)  # live rows → per-γ offsets from it
    ema: float = 0.8
    sampling: SamplingTimes | None = None  # verifying more positions (`verify_time`); None: not measured
    invariant: bool = False  # the engine's sampler is the invariant rule (a Gumbel hash per verified position)
    greedy: bool = False  # the mode of the steps predicted now (`AutoGamma` sets it from the call's params)
    _gamma_parts: dict[tuple[int, int, bool], tuple[list[float], list[float], list[float]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def corrections_state(self) -> dict:
        """The online corrections learnt from the steps run (not the calibration), for a resumed run
        (`SpecEngine.state_dict`): they go on adapting from there, on whatever hardware it runs."""
        return {"draft_scale": self.draft_scale, "overhead": dict(self.overhead),
                "plain_overhead": dict(self.plain_overhead),
                "overhead_offsets": {batch: list(offsets) for batch, offsets in self.overhead_offsets.items()}}

    def load_corrections_state(self, state: dict) -> None:
        scale = state["draft_scale"]
        self.draft_scale = None if scale is None else float(scale)
        self.overhead = {int(batch): float(extra) for batch, extra in state["overhead"].items()}
        # A state saved before plain steps were kept apart has none: they are learnt again from the next ones.
        self.plain_overhead = {int(batch): float(extra) for batch, extra in state.get("plain_overhead", {}).items()}
        self.overhead_offsets = {int(batch): [float(o) for o in offsets]
                                 for batch, offsets in state["overhead_offsets"].items()}

    def context_weight(self, context: int) -> float:
        """Where `context` lies between the two calibrated contexts (0 at the short one; the time is
        linear in the KV length the attention reads, and extrapolated past the long one)."""
        lo, hi = self.contexts
        if self.target_long is None or hi <= lo:
            return 0.0
        return max(0.0, (context - lo) / (hi - lo))

    def target_parts(self, batch: int, query_len: int) -> tuple[float, float]:
        """(seconds at the short context, seconds the long context adds): the forward's time at any
        context is `short + context_weight(context) * added`."""
        long = self.target_long
        short = self.target(batch, query_len)
        if long is None or self.contexts[1] <= self.contexts[0]:
            return short, 0.0
        # The long context is timed on a coarser query grid: the staircase in the query length comes
        # from the matrix products (the short table has every step of it), while what the longer
        # context adds — attention over the cached K/V — grows smoothly, so it is interpolated.
        return short, long(batch, query_len) - self.target.at(long.query_lens)(batch, query_len)

    def target_time(self, batch: int, query_len: int, context: int = CALIBRATION_CONTEXT) -> float:
        short, added = self.target_parts(batch, query_len)
        return max(short + self.context_weight(context) * added, 1e-7)

    def sampling_time(self, batch: int, tokens: int, positions: int | None = None) -> float:
        """Seconds a step verifying `tokens` tokens at `positions` positions (None: as many) spends sampling them
        (`SamplingTimes.seconds`, in the current mode; 0 where not measured). The learnt overheads are what is left
        of a step beyond its forwards and this: on the subword demo at 32 rows each verified position costs ~9 ms
        (a tenth of the forward), and when the speculative steps' overhead had as its prior the plain steps'
        (one position), the first break-even read 0.33-0.36 where the steps then measured 0.47-0.73."""
        if self.sampling is None:
            return 0.0
        return self.sampling.seconds(batch, tokens, tokens if positions is None else positions, self.greedy,
                                     self.invariant)

    def verify_time(self, batch: int, tokens: int, context: int = CALIBRATION_CONTEXT,
                    positions: int | None = None) -> float:
        """Calibrated seconds of verifying `tokens` tokens per row: the target's forward and the sampling."""
        return self.target_time(batch, tokens, context) + self.sampling_time(batch, tokens, positions)

    def draft_time(self, batch: int, gamma: int) -> float:
        """Calibrated seconds of γ drafts: a catch-up forward of up to two tokens, then γ - 1 of one."""
        return self.drafter(batch, 2) + (gamma - 1) * self.drafter(batch, 1) if gamma else 0.0

    def gamma_parts(self, batch: int, max_gamma: int) -> tuple[list[float], list[float], list[float]]:
        """For γ = 0..max_gamma at `batch` live rows, the calibrated parts of a step: the target's forward at the
        short context and what the long one adds (`target_parts`), and the drafts (`draft_time`). The γ policies
        ask every step, so the grid lookups are kept per (batch, max_gamma): a policy that costs a millisecond
        a step would eat a small model's gain."""
        parts = self._gamma_parts.get((batch, max_gamma, self.greedy))
        if parts is None:
            gammas = range(max_gamma + 1)
            target = [self.target_parts(batch, g + 1) for g in gammas]
            parts = self._gamma_parts[batch, max_gamma, self.greedy] = (
                [s + self.sampling_time(batch, g + 1) for g, (s, _) in zip(gammas, target)], [a for _, a in target],
                [self.draft_time(batch, g) for g in gammas])
        return parts

    def raw_step_time(self, batch: int, gamma: int, context: int = CALIBRATION_CONTEXT) -> tuple[float, float]:
        """Calibrated (verify, draft) seconds of a step with γ drafts for `batch` live rows."""
        return self.verify_time(batch, gamma + 1, context), self.draft_time(batch, gamma)

    def step_overheads(self, batch: int, max_gamma: int) -> list[float]:
        """Measured seconds a step spends beyond its calibrated forwards at `batch` live rows, for
        γ = 0..max_gamma. Speculative steps (γ ≥ 1): the batch size's overhead learnt from them (the nearest
        measured one's; before any, plain steps' as the prior) plus each (batch, γ)'s own offset where one was
        measured. Plain steps: their own (`plain_overhead`), where measured; before that, the speculative steps'.

        The two are kept apart because at a real vocabulary they differ by more than an offset: a speculative
        step samples and verifies γ + 1 positions of the vocabulary and rolls back, which the calibrated forwards
        do not time (subword demo world, one live row: tens of ms). Pooled, plain decoding inherited that cost and
        auto-γ kept drafting at 0.79× plain (docs/benchmarks.md, the long-tail workload with trees)."""
        pooled = self._carried(self.overhead, batch)
        plain = self._carried(self.plain_overhead, batch)
        if pooled is None:
            pooled = plain if plain is not None else 0.0
        offsets = self.overhead_offsets.get(batch) or []
        out = [pooled + (offsets[g] if g < len(offsets) else 0.0) for g in range(max_gamma + 1)]
        if plain is not None:
            out[0] = plain
        return out

    def _carried(self, table: dict[int, float], batch: int) -> float | None:
        """`table`'s overhead at `batch`, else the nearest measured batch size's (None where none was). A positive one
        (sampling, bookkeeping: time the calibrated forwards leave out) carries over in seconds; a negative one is
        the calibration overstating the forwards, so it carries as that share of the forward, scaled by the two
        sizes' calibrated plain forwards. Carried in seconds, −0.15 s learnt at 32 rows on the subword demo made a
        12-row plain step take negative time and the break-even acceptance there 0.0."""
        if batch in table:
            return table[batch]
        if not table:
            return None
        near = min(table, key=lambda b: abs(b - batch))
        if table[near] >= 0:
            return table[near]
        return table[near] * self.target_time(batch, 1) / self.target_time(near, 1)

    def corrected(self, batch: int, verify: list[float], draft: list[float]) -> list[float]:
        """Predicted step seconds for γ = 0, 1, … from their calibrated (verify, draft) parts."""
        overheads, scale = self.step_overheads(batch, len(verify) - 1), self.draft_scale or 1.0
        return [v + o + scale * d for v, o, d in zip(verify, overheads, draft)]

    def step_time(self, batch: int, gamma: int, context: int = CALIBRATION_CONTEXT) -> float:
        """Predicted seconds of one engine step with γ drafts for `batch` live rows."""
        parts = [self.raw_step_time(batch, g, context) for g in range(gamma + 1)]
        return self.corrected(batch, [v for v, _ in parts], [d for _, d in parts])[gamma]

    def observe(self, batch: int, gamma: int, seconds: float, context: int = CALIBRATION_CONTEXT,
                draft_seconds: float | None = None, predicted: tuple[float, float] | None = None) -> None:
        """Fold one measured step into the corrections. `draft_seconds`: the part of `seconds` spent
        drafting (None: unknown, taken as predicted); `predicted`: the step's `raw_step_time`, if the
        caller has it at hand."""
        verify, draft = predicted or self.raw_step_time(batch, gamma, context)
        if draft_seconds is None:
            draft_seconds = (self.draft_scale or 1.0) * draft
        elif gamma:
            ratio = draft_seconds / draft
            old = self.draft_scale
            # One stalled step (GC, another process) must not make drafting look dear for good.
            if old is not None:
                ratio = self.ema * old + (1 - self.ema) * min(max(ratio, old / 2), old * 2)
            self.draft_scale = ratio
        extra = seconds - draft_seconds - verify
        if gamma == 0:  # a plain step: its own overhead (`step_overheads`)
            old = self.plain_overhead.get(batch)
            self.plain_overhead[batch] = extra if old is None else self.ema * old + (1 - self.ema) * min(
                max(extra, -verify / 2), 2 * max(old, 0.0) + verify / 10)
            return
        old = self.overhead.get(batch)
        if old is None:
            self.overhead[batch] = extra
            return
        extra = min(max(extra, -verify / 2), 2 * max(old, 0.0) + verify / 10)  # ... nor a step look slow
        self.overhead[batch] = self.ema * old + (1 - self.ema) * extra
        # The calibrated forwards get the growth with γ right only to a few ms (e.g. one row at 450
        # tokens of context: 3.3 ms over for γ = 0, 0.4 ms for γ = 4), so each (batch, γ) also learns
        # an offset from the batch size's overhead; offsets of γ not run fade (memory ~OFFSET_MEMORY
        # steps at that batch size), so one unlucky measurement cannot rule a γ out for good.
        offsets = self.overhead_offsets.setdefault(batch, [0.0] * (gamma + 1))
        if len(offsets) <= gamma:
            offsets.extend([0.0] * (gamma + 1 - len(offsets)))
        fade = 1.0 - 1.0 / OFFSET_MEMORY
        for g in range(len(offsets)):
            if g != gamma:
                offsets[g] *= fade
        offsets[gamma] = self.ema * offsets[gamma] + (1 - self.ema) * (extra - self.overhead[batch])
