"""`specroll distill`'s one-page report: held-out expected acceptance per round, and the speed the engine's
calibrated cost model predicts against plain decoding at live batch 1 / 16 / 64.

The prediction takes the final held-out expected acceptance α (the first draft's, Σ min(p, q) on held-out
positions of the policy's own samples) as every draft's — independent acceptance, as `gamma.break_even` does:
a row emits Σ_{k≤γ} α^k tokens per step of predicted time t(b, γ) — and picks the best γ per batch size (γ = 0
when nothing pays). It is a prediction from calibrated forwards, not a measurement: later drafts of a head are
usually accepted less than the first, and a real step costs more than its forwards (the engine learns that
online). `specroll train` measures the real speed at the end of its run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specroll.rollout import EngineConfig, SpecEngine

BATCH_SIZES = (1, 16, 64)


@dataclass
class SpeedPrediction:
    batch: int
    gamma: int  # the best draft length at this batch size (0: plain decoding)
    speedup: float  # predicted tokens/s over plain decoding's
    break_even: float  # the acceptance below which no γ >= 1 pays here


def predict_speed(policy: Any, drafter: Any, kind: str, acceptance: float, max_gamma: int, device: str,
                  budget_s: float, cache: str | None, max_seq_len: int, context: int,
                  draft_vocab: int | None = None) -> list[SpeedPrediction]:
    """Calibrate the cost model of `policy` with `drafter` (an engine of `kind` at batch up to 64, rows of up to
    `max_seq_len` tokens, drafting over `draft_vocab` ids) and predict at `context` tokens of KV (a rollout's mean
    length half-way)."""
    from specroll.rollout.gamma.break_even import break_even_acceptance

    config = EngineConfig(max_batch_size=max(BATCH_SIZES), max_seq_len=max_seq_len, gamma="auto", max_gamma=max_gamma,
                          drafters=(kind,), device=device, cost_model_budget_s=budget_s, calibration_cache=cache,
                          draft_vocab=draft_vocab)
    cost = SpecEngine(policy, drafter, config).gamma_policy.cost
    predictions = []
    for batch in BATCH_SIZES:
        times = [cost.step_time(batch, gamma, context) for gamma in range(max_gamma + 1)]  # [γ + 1] seconds
        rates = [sum(acceptance ** k for k in range(gamma + 1)) / t for gamma, t in enumerate(times)]
        best = max(range(len(rates)), key=rates.__getitem__)
        predictions.append(SpeedPrediction(batch, best, rates[best] / rates[0], break_even_acceptance(times)))
    return predictions


def write_report(path: Path, settings: dict[str, Any], rounds: list[dict[str, Any]],
                 predictions: list[SpeedPrediction], output: str, models_yaml: str) -> Path:
    """The markdown page (`report.md` in the out folder)."""
    article = "an" if settings["kind"][0] in "aeiou" else "a"
    lines = [f"# specroll distill: {article} {settings['kind']} drafter for {settings['policy']}", "",
             f"{settings['num_sequences']} samples of {settings['num_prompts']} prompts "
             f"({settings['num_positions']} completion positions; T = {settings['temperature']}), "
             f"{settings['minutes']:g} minutes of training in two phases (each a learner from the drafter the last one "
             "published: its start is the phase's frozen shadow); every 4th prompt group held out.", "",
             "## Held-out expected acceptance per round", "",
             "| round | lr | steps | loss | candidate | served before | phase start | published |",
             "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rounds, 1):
        scores = " | ".join(_score(r[k]) for k in ("acceptance_after", "acceptance_before", "acceptance_frozen_shadow"))
        published = "yes" if r["published"] else "no" if r.get("gated", True) else "no (not scored: the budget ran out)"
        lines.append(f"| {i} | {r['lr']:g} | {r['num_steps']} | {r['loss']:.4f} | {scores} | {published} |")
    final = rounds[-1]["served"] if rounds else float("nan")
    lines += ["", f"Final (published) held-out expected acceptance: **{final:.4f}**.", "",
              "## Predicted speed against plain decoding (calibrated cost model)", "",
              f"At {settings['context']} tokens of KV per row (a mean sample half-way), γ up to 6.", "",
              "| live batch | best γ | predicted speed-up | break-even acceptance |", "|---|---|---|---|"]
    lines += [f"| {p.batch} | {p.gamma} | {p.speedup:.2f}x | {p.break_even:.3f} |" for p in predictions]
    lines += ["", "A prediction (every draft accepted at the held-out rate, forwards as calibrated on this machine), "
              "not a measurement.", "", "## Use it", "", f"Written: `{output}`. In a `specroll train` config:", "",
              "```yaml", models_yaml.rstrip(), "```", ""]
    path.write_text("\n".join(lines))
    return path


def _score(value: float) -> str:
    """A held-out score's cell: "—" for a round that was not scored (NaN)."""
    return "—" if math.isnan(value) else f"{value:.4f}"
