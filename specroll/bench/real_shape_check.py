"""The real-shape workload's auto-γ check: does `gamma: "auto"` speculate exactly where the cost table says it pays?

One engine with `gamma: "auto"` — its cost model calibrated at construction, the same one the table reads
(`real_shape_costs`) — and a `fixed_acceptance.FixedAcceptanceDrafter` over a drafter LM: the LM's real cost, each
draft kept with probability α. It runs greedy batches of `live` rows, one live batch size after another (all rows
the same budget, so the live batch stays `live` until the last step; `DISTINCT_PROMPTS` prompts repeated, as GRPO
repeats each prompt, so the plain reference run the drafter takes its answers from is a small batch). Each is
held against the table's ceiling for that drafter at α: below 1 the policy should run plain steps (γ = 0), above
1 speculate. Within
`MARGIN` of 1 either is right: the policy also weighs the per-step overheads it measured online, which the
zero-overhead ceiling leaves out. The verdict is the majority of steps (the policy now and then probes a γ it
does not prefer). A warm-up batch of `WARMUP_ROWS` rows runs first, uncounted: an engine's first step drafts max
γ by design (no acceptance seen yet), and a serving engine's acceptance estimate is warm — the check is about
that steady state, not the first steps.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.model import ModelDrafter
from specroll.rollout.gamma.cost_model import CostModel

from .fixed_acceptance import FixedAcceptanceDrafter
from .real_shape_costs import ceiling

MARGIN = 0.05  # a ceiling within this of 1 is too close to call: either choice agrees
WARMUP_ROWS = 4
DISTINCT_PROMPTS = 8


def reference_completions(target: PreTrainedModel, prompts: list[list[int]], tokens: int,
                          max_seq_len: int) -> dict[tuple[int, ...], list[int]]:
    """Each prompt's plain greedy completion of `tokens` tokens (the fixed-acceptance drafter's answer key)."""
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=len(prompts), max_seq_len=max_seq_len, gamma=0))
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=tokens, temperature=0.0))
    return {tuple(p): r.completion_ids for p, r in zip(prompts, rollouts)}


def auto_engine(target: PreTrainedModel, drafter: PreTrainedModel, references: dict[tuple[int, ...], list[int]],
                alpha: float, config: EngineConfig) -> SpecEngine:
    """An auto-γ engine (`config.gamma` "auto": it calibrates here) drafting with `drafter`'s cost at acceptance α."""
    device = torch.device(config.device)
    vocab = target.config.get_text_config().vocab_size
    inner = ModelDrafter(drafter, config.max_batch_size, config.cache_len, config.dtype, device, vocab,
                         config.lean_forward, config.state_history)
    return SpecEngine(target, FixedAcceptanceDrafter(inner, references, alpha, vocab), config)


def rows_of(prompts: list[list[int]], live: int) -> list[list[int]]:
    """`live` rows cycling through `prompts`."""
    return [prompts[i % len(prompts)] for i in range(live)]


def check(engine: SpecEngine, cost: CostModel, prompts: list[list[int]], batches: list[int], tokens: int,
          alpha: float) -> list[dict]:
    """Run greedy batches of each live size in `batches` (rows cycling through `prompts`) and compare the γ chosen
    per step with the ceiling of `cost` (the engine's calibration, read before it ran) at α."""
    max_gamma = engine.config.max_gamma
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0)
    engine.generate(rows_of(prompts, WARMUP_ROWS), params)  # the warm-up (module docstring)
    out = []
    for live in batches:
        before = engine.stats.totals()
        counts_before = (list(engine.stats.drafted_per_position), list(engine.stats.accepted_per_position))
        engine.generate(rows_of(prompts, live), params)
        done = engine.stats.since(before)
        alpha_seen = conditional_acceptance(counts_before, (engine.stats.drafted_per_position,
                                                            engine.stats.accepted_per_position))
        gammas = list(engine.stats.gamma_per_step)[-done.steps:]
        share = sum(g > 0 for g in gammas) / len(gammas)
        table = ceiling(cost, live, alpha, max_gamma)
        speculates, pays = share >= 0.5, table.speedup > 1.0
        marginal = abs(table.speedup - 1.0) <= MARGIN
        out.append({"batch": live, "ceiling": table.speedup, "table_gamma": table.gamma, "gammas": gammas,
                    "speculative_share": share, "acceptance": alpha_seen,
                    "tokens_per_s": done.tokens_per_s, "verdict": "speculates" if speculates else "plain",
                    "table_says": "pays" if pays else "does not pay", "marginal": marginal,
                    "agrees": marginal or speculates == pays})
    return out


def conditional_acceptance(before: tuple[list[int], list[int]], after: tuple[list[int], list[int]]) -> float | None:
    """P(draft i kept | drafts < i kept), pooled over positions, from the engine's per-position (drafted, kept)
    counts before and after a call — the α of the table (the engine's `acceptance_rate`, kept / drafted, also
    counts the drafts after a row's first rejection). None if nothing was drafted."""
    def delta(new: list[int], old: list[int]) -> list[int]:
        return [n - (old[i] if i < len(old) else 0) for i, n in enumerate(new)]

    drafted, kept = delta(after[0], before[0]), delta(after[1], before[1])
    reached = [min(d, k) for d, k in zip(drafted, [drafted[0], *kept])] if drafted else []
    return sum(kept) / sum(reached) if sum(reached) else None
