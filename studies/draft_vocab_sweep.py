"""What a draft vocabulary of N ids costs in acceptance and saves in draft time (#35): the table that picks N.

On the demo models (`--models demo-bpe`: the subword world, V = 32,768; `demo`: the character world) the target
samples completions at T = 1 with the drafter, recording its top-k p at every position. The token counts of the
first half of the rollouts choose each subset (`draft_vocab.top_ids`, as the online learner does); on the
second half the drafter's expected acceptance Σ min(p, q) is scored with q over the whole vocabulary and over
each subset (renormalised there, as the engine drafts: `Scorer.over`), paired on the same positions. Then each
N's draft cost per token: the drafter's own `time_drafts` in an engine with `draft_vocab = N` (a catch-up draft
plus γ − 1 single ones, γ = 4, at live batch 1 and 16), in units of the target's plain step at that batch. The
machine's load average is printed with the table: time it on a quiet machine.

    python studies/draft_vocab_sweep.py --models demo-bpe --sizes 512,2048,8192,16384
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from specroll.bench.models import load_bench_models
from specroll.online_drafter.lm.data import to_buffered
from specroll.online_drafter.lm.scorer import DrafterScorer
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.draft_vocab import top_ids
from specroll.rollout.models.timing import time_forwards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="demo-bpe", choices=["demo-bpe", "demo", "tiny"])
    parser.add_argument("--sizes", default="512,2048,8192,16384")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="bench_results/draft_vocab_sweep.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = load_bench_models(args.models, args.prompts, seed=0)
    vocab = models.target.get_output_embeddings().weight.shape[0]
    sizes = [int(s) for s in args.sizes.split(",") if int(s) < vocab]
    batches = [int(b) for b in args.batches.split(",")]

    engine = SpecEngine(models.target, models.drafter, EngineConfig(
        max_batch_size=32, max_seq_len=max(len(p) for p in models.prompts) + args.max_new_tokens + 2, gamma=4,
        record_signals=True, signal_top_k=32))
    started = time.perf_counter()
    rollouts = engine.generate(models.prompts, SamplingParams(args.max_new_tokens, temperature=1.0, seed=0),
                               n=args.samples)
    generate_s = time.perf_counter() - started
    half = len(rollouts) // 2  # whole prompt groups on each side (a prompt's samples are consecutive)
    half -= half % args.samples
    counted, scored = rollouts[:half], [to_buffered(r) for r in rollouts[half:]]
    counts = torch.zeros(vocab, dtype=torch.float64)
    for r in counted:
        counts += torch.bincount(torch.tensor(r.completion_ids), minlength=vocab).double()
    emitted = torch.tensor([t for r in rollouts[half:] for t in r.completion_ids])

    scorer = DrafterScorer(1.0, 16, 1.0, torch.device("cpu"))
    drafter = engine.drafter.runner.model

    def acceptance(ids: torch.Tensor | None) -> torch.Tensor:
        with scorer.over(ids):
            per_entry = scorer.score_entries(drafter, scored)  # [R, (sum, count)]
        return per_entry

    full = acceptance(None)
    rows = [{"draft_vocab": None, "acceptance": float(full[:, 0].sum() / full[:, 1].sum()), "covered": 1.0}]
    for size in sizes:
        ids = top_ids(counts, size)
        per_entry = acceptance(ids)
        diff = (full[:, 0] - per_entry[:, 0]) / per_entry[:, 1].clamp_min(1)  # per rollout, paired
        rows.append({"draft_vocab": size, "acceptance": float(per_entry[:, 0].sum() / per_entry[:, 1].sum()),
                     "lost_points": float(100 * (full[:, 0].sum() - per_entry[:, 0].sum()) / full[:, 1].sum()),
                     "lost_se_points": float(100 * diff.std() / len(diff) ** 0.5),
                     "covered": float(torch.isin(emitted, ids).float().mean())})

    runner = SpecEngine(models.target, None, EngineConfig(max_batch_size=max(batches), gamma=0)).target
    plain_step = time_forwards(runner, batches, [1], time.perf_counter() + 30)  # the target's plain step
    for row in rows:
        config = EngineConfig(max_batch_size=max(batches), max_seq_len=256, gamma=0, draft_vocab=row["draft_vocab"])
        times = SpecEngine(models.target, models.drafter, config).drafter.time_drafts(batches, time.perf_counter() + 30)
        row["draft_per_token_plain_steps"] = {
            str(b): (times(b, 2) + 3 * times(b, 1)) / 4 / plain_step(b, 1) for b in batches}

    load = os.getloadavg()
    print(f"{args.models}: V = {vocab}, {len(rollouts)} rollouts at T = 1 ({emitted.numel()} tokens scored, "
          f"{generate_s:.0f} s to generate); load average {load[0]:.2f}, torch threads {args.threads}")
    print("| draft vocab N | tokens covered | expected acceptance | lost (points, ± se over rollouts) | "
          + " | ".join(f"draft/token at b={b} (plain steps)" for b in batches) + " |")
    print("|---:|---:|---:|---:|" + "---:|" * len(batches))
    for row in rows:
        lost = "—" if row["draft_vocab"] is None else f"{row['lost_points']:.2f} ± {row['lost_se_points']:.2f}"
        cost = " | ".join(f"{row['draft_per_token_plain_steps'][str(b)]:.3f}" for b in batches)
        print(f"| {row['draft_vocab'] or f'all {vocab}'} | {row['covered']:.4f} | {row['acceptance']:.4f} | {lost} | "
              f"{cost} |")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"models": args.models, "vocab": vocab, "load": load, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
