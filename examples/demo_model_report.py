"""Measure the demo models from one run: build, size, speed, accuracy, styles and drafter agreement.

    python examples/demo_model_report.py [--tiny] [--cache-dir DIR] [--samples 256] [--threads 1]

Builds the models if the cache lacks them, then prints: build time, parameter counts, per-step
forward cost of target and drafter (the engine's `ModelRunner`, one decode token per row, batch 1
and 16), SFT accuracy (T = 1 and greedy), completion-length percentiles, the share of each
solution style, and the drafter's greedy agreement and expected acceptance Σ min(p, q) at T = 1
on target samples — overall and per style, since GRPO shifts the mix toward the compact style.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specroll.demo.generate import completion_texts, sample_completions
from specroll.demo.model_cache import load_or_build_demo_models
from specroll.demo.recipe import DemoRecipe
from specroll.demo.reward import score
from specroll.demo.task import make_problems, max_completion_tokens, style_of
from specroll.rollout.models.runner import ModelRunner

EVAL_SEED = 10_000  # problem stream the build never trains on


def forward_ms(model, batch: int, context: int = 32, reps: int = 30) -> float:
    """Median wall time of one decode step (1 new token per row after `context` cached tokens)."""
    runner = ModelRunner(model, batch, context + 8, torch.float32, torch.device("cpu"))
    rows = slice(0, batch)
    runner.feed(rows, torch.randint(3, 50, (batch, context)))
    token = torch.randint(3, 50, (batch, 1))
    times = []
    for _ in range(reps):
        runner.rollback(rows, torch.full((batch,), context))
        started = time.perf_counter()
        runner.feed(rows, token)
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


@torch.inference_mode()
def drafter_match(drafter, rollouts) -> dict[str, list[float]]:
    """Per completion position: greedy agreement and Σ min(p, q), p from the recorded signals."""
    agree, overlap = [], []
    for r in rollouts:
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        logits = drafter(input_ids=ids).logits[0, len(r.prompt_ids) - 1 : -1].float()  # [T, V]
        q = logits.softmax(-1)
        p = torch.zeros_like(q).scatter_(1, r.signals.topk_ids.long(), r.signals.topk_probs)  # [T, V]
        agree += (p.argmax(-1) == q.argmax(-1)).float().tolist()
        overlap += torch.minimum(p, q).sum(-1).tolist()
    return {"agree": agree, "overlap": overlap}


def percentile(values: list[int], fraction: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = DemoRecipe.tiny() if args.tiny else DemoRecipe()
    started = time.perf_counter()
    models = load_or_build_demo_models(recipe, args.cache_dir)
    print(f"# demo models {models.path} (threads={torch.get_num_threads()})")
    print(f"build log: {models.build_log}")
    print(f"load_or_build wall time this run: {time.perf_counter() - started:.1f}s")
    count = lambda m: sum(p.numel() for p in m.parameters())
    print(f"params: target {count(models.target) / 1e6:.2f}M, drafter {count(models.drafter) / 1e6:.3f}M")
    for batch in (1, 16):
        t_ms, d_ms = forward_ms(models.target, batch), forward_ms(models.drafter, batch)
        print(f"decode step batch {batch}: target {t_ms:.2f} ms, drafter {d_ms:.2f} ms, ratio {t_ms / d_ms:.1f}x")

    problems = make_problems(args.samples, seed=EVAL_SEED, max_digits=recipe.max_digits)
    limit = max_completion_tokens(recipe.max_digits)
    for temperature in (1.0, 0.0):
        rollouts = sample_completions(models.target, models.tokenizer, problems, temperature, limit, seed=0,
                                      record_signals=temperature == 1.0)
        texts = completion_texts(models.tokenizer, rollouts)
        rewards = [score(p, t) for p, t in zip(problems, texts)]
        styles = [style_of(t) for t in texts]
        print(f"\n## target samples at T={temperature} ({len(problems)} problems)")
        print(f"accuracy {sum(r > 0 for r in rewards) / len(rewards):.3f}, mean reward {statistics.mean(rewards):.3f}")
        for style in {s for s in styles}:
            name = style.value if style else "malformed"
            share = styles.count(style) / len(styles)
            correct = [r > 0 for r, s in zip(rewards, styles) if s == style]
            print(f"  style {name}: share {share:.3f}, accuracy {sum(correct) / len(correct):.3f}")
        if temperature != 1.0:
            continue
        lengths = [len(r.completion_ids) for r in rollouts]
        p50, p90 = percentile(lengths, 0.5), percentile(lengths, 0.9)
        print(f"completion tokens: p10 {percentile(lengths, 0.1):.0f}, p50 {p50:.0f}, p90 {p90:.0f}, "
              f"p99 {percentile(lengths, 0.99):.0f}, max {max(lengths)}; p90/p50 {p90 / p50:.2f}")
        by_style = {"all": rollouts}
        for style in {s for s in styles if s}:
            by_style[style.value] = [r for r, s in zip(rollouts, styles) if s == style]
        for name, group in by_style.items():
            match = drafter_match(models.drafter, group)
            print(f"drafter vs target on {name} samples ({len(match['agree'])} positions): greedy agreement "
                  f"{statistics.mean(match['agree']):.3f}, expected acceptance Σmin(p,q) "
                  f"{statistics.mean(match['overlap']):.3f}")


if __name__ == "__main__":
    main()
