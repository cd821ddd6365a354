"""The chain step: up to γ drafts per live row, verified with one target forward of γ + 1 tokens per row.

The drafter proposes γ tokens per row (none at γ = 0: a plain step, the fair baseline); an adaptive γ policy may
verify fewer columns where the drafter says what each width is expected to keep (`Proposal.expected_kept`). The
target scores the row's last token and the drafts; the accept rule (`sampling.accept.AcceptRule.verify`) keeps a
different number per row. The stages after verification are every step's (`base.DecodeStep.run`).

Auto-γ's cost model learns the draft part of a step's time. On a device that runs asynchronously the clock must wait
for the drafts (a sync), so only every `DRAFT_TIMING_EVERY`-th drafting step is timed; the cost model takes the
others' draft part as predicted from the timed ones (`CostModel.observe`). On a CPU every step is timed, free.

A step planned to overlap (`StepPlan.overlap`) hands its drafts to the drafter before the target's forward
(`placement.ahead.AheadDrafter.draft_ahead`), which drafts the next step on its own thread meanwhile.
"""

from __future__ import annotations

import time

import torch

from ..config import SamplingParams
from ..core.append import VerifiedStep
from ..core.batch import RowBuffers
from ..core.stats import EngineStats
from ..drafters.protocol import Drafter, Proposal
from ..engine_speculation import EngineSpeculation, StepPlan
from ..models.runner import ModelRunner
from ..models.timing import runs_async
from ..sampling.accept import AcceptRule
from ..sampling.draft_q import DraftQ
from ..sampling.logits import process_logits
from ..sampling.noise import StepNoise
from .base import DecodeStep, Verified

DRAFT_TIMING_EVERY = 16  # on an async device, the drafting steps whose draft part auto-γ times (one sync each)


class ChainStep(DecodeStep):
    """The chain step of one engine (module docstring): `rule` keeps each row's drafts; `speculation`'s γ policy
    narrows proposals and is told the draft time."""

    def __init__(self, target: ModelRunner, drafter: Drafter | None, stats: EngineStats, vocab_size: int,
                 rule: AcceptRule, speculation: EngineSpeculation):
        super().__init__(target, drafter, stats, vocab_size)
        self.rule, self.speculation = rule, speculation
        self.drafting_steps = 0  # drafting steps run on an async device (every DRAFT_TIMING_EVERY-th is timed)

    def _verify(self, rows: RowBuffers, live: slice, seq_len: torch.Tensor, noise: StepNoise, plan: StepPlan,
                params: SamplingParams) -> Verified:
        gamma = plan.depth
        proposal = self._narrow(plan, self._propose(rows, live, gamma, params, noise))
        if proposal.drafts.shape[1] < gamma:  # the last columns are not worth verifying
            gamma = proposal.drafts.shape[1]
            noise = noise.narrow(gamma + 1)
        drafted = self._draft_clock(gamma)
        if plan.overlap:
            self.drafter.draft_ahead(live, rows, params)
        usable = proposal.usable(gamma)  # [n, γ]
        fed = torch.cat([self.last_tokens(rows, live, seq_len), proposal.drafts], dim=1)  # [n, γ+1]
        logits = self.target.feed(live, fed, rows.hidden)  # [n, γ+1, V] in the target's dtype
        p = process_logits(logits, params)  # [n, γ+1, V] fp32
        verdict = self.rule.verify(proposal.drafts, proposal.q, p, noise, usable)
        step = VerifiedStep(seq_len, proposal.drafts, proposal.lengths, proposal.source, usable, verdict, logits, p)
        return Verified(step, gamma, usable.sum(1), bool(gamma) and self.speculation.gamma_policy.adaptive, drafted)

    def _propose(self, rows: RowBuffers, live: slice, gamma: int, params: SamplingParams,
                 noise: StepNoise) -> Proposal:
        if not gamma:
            return Proposal(torch.empty(live.stop, 0, dtype=torch.long, device=rows.tokens.device),
                            DraftQ(None, None, None, self.vocab_size))
        return self.drafter.propose(live, rows, gamma, params, noise.draw_draft)

    def _narrow(self, plan: StepPlan, proposal: Proposal) -> Proposal:
        """The proposal cut to the width the γ policy finds worth verifying, if the drafter said what
        each width is expected to keep."""
        policy = self.speculation.gamma_policy
        if proposal.expected_kept is None or not policy.adaptive:
            return proposal
        return proposal.narrow(policy.narrow(plan.shape, proposal.expected_kept))

    def _draft_clock(self, gamma: int) -> float | None:
        """When this step's drafting ended, for an adaptive γ policy's cost model (None: not measured; see the
        module docstring)."""
        if not self.speculation.gamma_policy.adaptive:
            return None
        device = self.target.device
        if gamma and runs_async(device):
            self.drafting_steps += 1
            if self.drafting_steps % DRAFT_TIMING_EVERY:
                return None
            torch.cuda.synchronize(device)
        return time.perf_counter()
