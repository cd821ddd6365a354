"""Does optimising the demo reward move the policy away from a frozen drafter? A cheap GRPO stand-in.

    python examples/demo_drift_check.py [--rounds 3] [--prompts 128] [--group 4] [--threads 1]

Each round samples `group` completions per prompt from the target at T = 1, keeps those whose
reward beats their group's mean (GRPO's positive-advantage samples), and fine-tunes the target on
them (filtered behaviour cloning: the direction a GRPO step pushes, without the policy-gradient
machinery). Before every round it prints the mean reward, the compact-style share, the mean
completion length, and the frozen drafter's expected acceptance Σ min(p, q) on the fresh samples —
which should fall as the policy drifts toward the compact style the drafter saw little of.
Works on a copy; the cached models are not modified.
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from specroll.demo.generate import completion_texts, sample_completions
from specroll.demo.model_cache import load_or_build_demo_models
from specroll.demo.pretrain import Example, train
from specroll.demo.recipe import DemoRecipe, TrainStage
from specroll.demo.reward import score
from specroll.demo.task import Style, make_problems, max_completion_tokens, style_of

DRIFT_SEED = 20_000


@torch.inference_mode()
def expected_acceptance(drafter, rollouts) -> float:
    overlaps = []
    for r in rollouts:
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        q = drafter(input_ids=ids).logits[0, len(r.prompt_ids) - 1 : -1].float().softmax(-1)  # [T, V]
        p = torch.zeros_like(q).scatter_(1, r.signals.topk_ids.long(), r.signals.topk_probs.float())  # [T, V]
        overlaps += torch.minimum(p, q).sum(-1).tolist()
    return statistics.mean(overlaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = DemoRecipe.tiny() if args.tiny else DemoRecipe()
    models = load_or_build_demo_models(recipe, args.cache_dir)
    policy, tokenizer = copy.deepcopy(models.target), models.tokenizer
    problems = make_problems(args.prompts, seed=DRIFT_SEED, max_digits=recipe.max_digits)
    grouped = [p for p in problems for _ in range(args.group)]
    limit = max_completion_tokens(recipe.max_digits)
    print(f"# filtered-BC drift check: {args.prompts} prompts x {args.group}, {args.steps} steps/round, lr {args.lr}")
    for round_index in range(args.rounds + 1):
        rollouts = sample_completions(policy, tokenizer, grouped, 1.0, limit, seed=round_index, record_signals=True)
        texts = completion_texts(tokenizer, rollouts)
        rewards = [score(p, t) for p, t in zip(grouped, texts)]
        multi = [style_of(t) for p, t in zip(grouped, texts) if p.num_columns > 1]
        print(f"round {round_index}: reward {statistics.mean(rewards):.3f}, "
              f"accuracy {statistics.mean(r > 0 for r in rewards):.3f}, "
              f"compact share (multi-column) {multi.count(Style.COMPACT) / max(1, len(multi)):.3f}, "
              f"mean length {statistics.mean(len(r.completion_ids) for r in rollouts):.1f}, "
              f"frozen drafter Σmin(p,q) {expected_acceptance(models.drafter, rollouts):.3f}", flush=True)
        if round_index == args.rounds:
            break
        kept = []
        for start in range(0, len(rollouts), args.group):
            group = rewards[start : start + args.group]
            mean = statistics.mean(group)
            for r, reward in zip(rollouts[start : start + args.group], group):
                if reward > mean:
                    kept.append(Example(r.prompt_ids + r.completion_ids, len(r.prompt_ids)))
        if kept:
            train(policy, kept, TrainStage(args.steps, 16, args.lr), tokenizer.pad_token_id, seed=round_index,
                  desc=f"round {round_index}", progress=False)


if __name__ == "__main__":
    main()
