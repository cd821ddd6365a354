"""The real-shape workload's numbers: the target's calibrated forwards, each drafter's drafts, and the ceiling.

They are the numbers `gamma: "auto"` decides on. The target's forward times are the cost model an auto-γ engine
calibrated at construction (`SpecEngine.gamma_policy.cost`: `gamma.calibration.calibrate`); each drafter's are its
own `Drafter.time_drafts` on the same batch grid, built by the engine from `EngineConfig.drafters` (with
`draft_vocab` where asked) — the two halves `calibrate` joins into a `CostModel`. The **ceiling** of a drafter at
live batch b and per-draft acceptance α is the zero-overhead speedup over plain decoding:

    ceiling(b, α) = max over γ = 1..max_gamma of  tokens(α, γ) · t(b, 1) / (t(b, γ + 1) + d(b, γ)),
    tokens(α, γ)  = (1 − α^(γ+1)) / (1 − α)   (expected tokens per step when each draft is kept with α)

with t(b, Q) the target's forward of Q tokens per row and d(b, γ) the γ drafts (`CostModel.target_time`,
`CostModel.draft_time`: a catch-up draft, then γ − 1 single ones). It is what a step would gain if it cost only
its calibrated forwards; the engine's sampling and bookkeeping add to both sides (the engine learns them online).
Below 1, no γ pays at that acceptance: auto-γ should decode plainly there.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel

from specroll.rollout import EngineConfig, SpecEngine
from specroll.rollout.gamma.break_even import break_even_acceptance
from specroll.rollout.gamma.cost_model import CostModel
from specroll.rollout.models.timing import ForwardTimes


@dataclass(frozen=True)
class DrafterSpec:
    """One row of the table: `kinds` (`EngineConfig.drafters`) built from `weights` (a drafter LM, or None for
    the kinds that read the target or nothing), over `draft_vocab` ids (None: the whole vocabulary)."""

    name: str
    kinds: tuple[str, ...]
    weights: PreTrainedModel | None = None
    draft_vocab: int | None = None
    layer_skip_layers: int | None = None


@dataclass(frozen=True)
class Ceiling:
    gamma: int  # the best γ ≥ 1
    speedup: float  # its zero-overhead speedup over a plain step


def tokens_per_step(alpha: float, gamma: int) -> float:
    """Expected tokens a row emits in a step of γ drafts, each kept with probability α (the bonus token included)."""
    return float(gamma + 1) if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def ceiling(cost: CostModel, batch: int, alpha: float, max_gamma: int) -> Ceiling:
    """The best γ ≥ 1 at `batch` live rows and acceptance α, and its zero-overhead speedup (module docstring)."""
    plain = cost.target_time(batch, 1)
    speedups = {g: tokens_per_step(alpha, g) * plain / (cost.target_time(batch, g + 1) + cost.draft_time(batch, g))
                for g in range(1, max_gamma + 1)}
    best = max(speedups, key=speedups.__getitem__)
    return Ceiling(best, speedups[best])


def break_even(cost: CostModel, batch: int, max_gamma: int) -> float:
    """The per-draft acceptance below which no γ pays at `batch` rows (`gamma.break_even`), from the same costs."""
    return break_even_acceptance([cost.target_time(batch, g + 1) + cost.draft_time(batch, g)
                                  for g in range(max_gamma + 1)])


def with_drafter(cost: CostModel, drafter: ForwardTimes) -> CostModel:
    """`cost`'s calibrated target with another drafter's draft times (what `calibrate` would build for it)."""
    return CostModel(target=cost.target, drafter=drafter, target_long=cost.target_long, contexts=cost.contexts)


def time_drafter(target: PreTrainedModel, spec: DrafterSpec, base: EngineConfig, batch_sizes: list[int],
                 budget_s: float) -> ForwardTimes:
    """`spec`'s drafts timed by its own `time_drafts` in an engine built as `base` says (fixed γ: no calibration); a
    block drafter's block drafts `base.max_gamma` tokens (k = max_gamma + 1), the γ the table prices."""
    config = EngineConfig(max_batch_size=base.max_batch_size, max_seq_len=base.max_seq_len, gamma=0,
                          max_gamma=base.max_gamma, dtype=base.dtype, drafters=spec.kinds,
                          draft_vocab=spec.draft_vocab, layer_skip_layers=spec.layer_skip_layers,
                          block_size=base.max_gamma + 1)
    engine = SpecEngine(target, spec.weights, config)
    return engine.drafter.time_drafts(batch_sizes, time.perf_counter() + budget_s)


def drafter_row(spec: DrafterSpec, cost: CostModel, batches: list[int], alphas: list[float], max_gamma: int) -> dict:
    """The table row of one drafter: per live batch its draft seconds (catch-up draft, each further one), what
    each γ's step costs (verify, drafts), the ceiling at each α and the break-even acceptance."""
    cells = []
    for b in batches:
        gammas = range(max_gamma + 1)
        cells.append({
            "batch": b,
            "plain_s": cost.target_time(b, 1),
            "first_draft_s": cost.drafter(b, 2),
            "further_draft_s": cost.drafter(b, 1),
            "verify_s": [cost.target_time(b, g + 1) for g in gammas],  # index γ
            "drafts_s": [cost.draft_time(b, g) for g in gammas],
            "draft_per_token_plain_steps": cost.draft_time(b, max_gamma) / max_gamma / cost.target_time(b, 1),
            "ceilings": {str(a): asdict(ceiling(cost, b, a, max_gamma)) for a in alphas},
            "break_even_alpha": break_even(cost, b, max_gamma),
        })
    weights = spec.weights
    return {"name": spec.name, "kinds": list(spec.kinds), "draft_vocab": spec.draft_vocab,
            "layer_skip_layers": spec.layer_skip_layers,
            "params_m": None if weights is None else sum(p.numel() for p in weights.parameters()) / 1e6,
            "times": asdict(cost.drafter), "per_batch": cells}


def forward_rows(cost: CostModel, batches: list[int], query_lens: list[int]) -> list[dict]:
    """The target's forward seconds by (live batch, query length), and in plain steps at that batch; `on_grid`:
    a calibrated point (else interpolated between them)."""
    return [{"batch": b, "query_len": q, "seconds": cost.target_time(b, q),
             "plain_steps": cost.target_time(b, q) / cost.target_time(b, 1),
             "on_grid": b in cost.target.batch_sizes and q in cost.target.query_lens}
            for b in batches for q in query_lens]


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """`count` distinct random prompts (the fixed-acceptance drafter finds each row's reference by its prompt)."""
    gen = torch.Generator().manual_seed(seed)
    prompts: dict[tuple[int, ...], None] = {}
    while len(prompts) < count:
        prompts[tuple(torch.randint(vocab, (length,), generator=gen).tolist())] = None
    return [list(p) for p in prompts]
