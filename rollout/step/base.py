"""The one shape of a decoding step, and the stages a chain step and a tree step share (`DecodeStep.run`).

A step of the first n rows, as planned (`engine_speculation.StepPlan`: γ drafts per row, or a tree of γ levels of w):

1. begin: each row's length before the step (a copy: appending moves `rows.seq_len`) and the step's noise;
2. verify (the step's own): the drafter proposes, one target forward scores the proposal, the accept rule keeps a
   prefix (a chain) or a root-to-node path (a tree) — given to the stages after it as a chain step of γ = depth
   (`core.append.VerifiedStep`);
3. append the kept tokens (`core.append.append_kept`: the step's one device→host copy);
4. settle (the step's own: a tree moves its kept path's K/V where a chain would have written it);
5. roll the target cache back to what was kept (`ModelRunner.rollback`: every token of a row but the last) and
   tell the drafter what was kept (`Drafter.keep`);
6. count the step (`EngineStats.record_step`) and report it (`StepReport`), for the policies that planned it to
   learn from (`engine_speculation.EngineSpeculation.observe`).

`ChainStep` (`chain`) and `TreeStep` (`tree`) implement 2 and 4; the engine picks one per step by the plan's width.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..config import SamplingParams
from ..core.append import VerifiedStep, append_kept
from ..core.batch import RowBuffers
from ..core.stats import EngineStats
from ..drafters.protocol import Drafter
from ..engine_speculation import StepPlan, StepReport
from ..models.runner import ModelRunner
from ..sampling.noise import StepNoise


@dataclass
class Verified:
    """What a step's verification decided, for the stages after it."""

    step: VerifiedStep  # the kept prefix or path, as a chain step of γ = `depth`
    depth: int  # the γ verified (a chain may verify fewer columns than planned)
    drafted_len: torch.Tensor  # [n] the drafts of the proposal verified per row, for `Drafter.keep`
    count_evidence: bool  # fold auto-γ's acceptance counts into the step's copy
    draft_done: float | None = None  # when drafting ended (`time.perf_counter`), if the step was timed


class DecodeStep(ABC):
    """A decoding step of one engine (module docstring): its target, its drafter (None: plain decoding), its
    stats and the target's vocabulary size."""

    def __init__(self, target: ModelRunner, drafter: Drafter | None, stats: EngineStats, vocab_size: int):
        self.target, self.drafter, self.stats, self.vocab_size = target, drafter, stats, vocab_size

    def run(self, rows: RowBuffers, plan: StepPlan, params: SamplingParams, stop_ids: torch.Tensor) -> StepReport:
        """One step of the first `plan.shape.rows` rows of `rows`."""
        started = time.perf_counter()
        n = plan.shape.rows
        live = slice(0, n)
        # A copy, not a view: `append_kept` moves rows.seq_len, and the drafter rolls back to the old length.
        seq_len = rows.seq_len[live].clone()  # [n]
        noise = StepNoise(rows.keys[live], seq_len, plan.depth + 1, self.vocab_size, params.greedy)
        verified = self._verify(rows, live, seq_len, noise, plan, params)
        names = self.drafter.names if self.drafter else ()
        summary = append_kept(rows, live, verified.step, params, stop_ids, names, verified.count_evidence)
        self._settle(rows, live, verified)
        self.target.rollback(live, rows.seq_len[live] - 1, [length - 1 for length in rows.host_seq_len[:n]])
        if self.drafter:
            self.drafter.keep(live, rows, seq_len, verified.step.verdict.accepted_len, verified.drafted_len)
        self.stats.record_step(verified.depth, n, summary, context=max(rows.host_seq_len[:n]),
                               tree_nodes=n * plan.depth * plan.width if plan.width > 1 else 0)
        draft_seconds = None if verified.draft_done is None else verified.draft_done - started
        return StepReport(plan, verified.depth, summary, rows.last_step, time.perf_counter() - started, draft_seconds)

    @staticmethod
    def last_tokens(rows: RowBuffers, live: slice, seq_len: torch.Tensor) -> torch.Tensor:
        """[n, 1] each row's last token: the one the target has not cached yet, fed first."""
        return rows.tokens[live].gather(1, (seq_len - 1)[:, None])

    @abstractmethod
    def _verify(self, rows: RowBuffers, live: slice, seq_len: torch.Tensor, noise: StepNoise, plan: StepPlan,
                params: SamplingParams) -> Verified:
        """Propose, score with one target forward, and keep what the accept rule keeps."""

    def _settle(self, rows: RowBuffers, live: slice, verified: Verified) -> None:  # noqa: B027 (a hook: chains keep it)
        """After appending, before the rollback: put the kept tokens' K/V where a chain step writes them (a chain's
        already are)."""
