"""KL or TV? Which distillation loss recovers more acceptance on a drifted policy, step for step.

    python studies/learner_losses.py --policy specroll_report/policy.safetensors

`--policy` is the final policy of a main job run with `report.save_policy: true` (the demo target
after GRPO moved it to the compact style). The benchmark samples rollouts of that policy at T = 1
with the engine's recorded signals (top-`signal_top_k`, as a run records them) on training prompts
and on disjoint held-out prompts, then distils the frozen demo drafter on the training rollouts with
each loss and learning rate — identical batches for every contender (the buffer's sampler is seeded
and does not depend on the model) — and scores every candidate's expected acceptance Σ min(p, q) on
the held-out rollouts after each block of steps. Gains are paired on the same positions with a
prompt-group-clustered standard error (`online_drafter.gate.paired`): tv − kl, and each − frozen.
Acceptance, not time, is what it measures, so machine load does not bias it (only slows it).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from specroll.demo import DemoRecipe, load_or_build_demo_models
from specroll.demo.task import make_problems, max_completion_tokens, to_messages
from specroll.demo.tokenizer import encode_prompt
from specroll.online_drafter import DraftLearner, LearnerConfig
from specroll.online_drafter.gate.paired import paired_gain
from specroll.online_drafter.lm.data import to_buffered
from specroll.online_drafter.lm.scorer import DrafterScorer
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.models.weights import copy_into


def sample(policy, tokenizer, problems, limit: int, group: int, seed: int, top_k: int):
    prompts = [encode_prompt(tokenizer, to_messages(p)) for p in problems]
    engine = SpecEngine(policy, None, EngineConfig(max_batch_size=64, max_seq_len=max(map(len, prompts)) + limit,
                                                   gamma=0, record_signals=True, signal_top_k=top_k))
    params = SamplingParams(max_new_tokens=limit, temperature=1.0, stop_token_ids=(tokenizer.eos_token_id,),
                            seed=seed)
    return engine.generate(prompts, params, n=group)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="specroll_report/policy.safetensors",
                        help="final policy of a main job run with report.save_policy: true")
    parser.add_argument("--train-prompts", type=int, default=96)
    parser.add_argument("--heldout-prompts", type=int, default=48)
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (a held-out group)")
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 1e-3])
    parser.add_argument("--blocks", type=int, nargs="+", default=[25, 50, 100],
                        help="score the candidates after this many steps (cumulative)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--signal-top-k", type=int, default=EngineConfig.signal_top_k)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from safetensors.torch import load_file

    started = time.perf_counter()
    recipe = DemoRecipe()
    models = load_or_build_demo_models(recipe)
    limit = max_completion_tokens(recipe.max_digits)
    policy = copy.deepcopy(models.target)
    copy_into(policy, load_file(args.policy), f"policy {args.policy}")
    policy.eval()
    problems = make_problems(args.train_prompts + args.heldout_prompts, seed=31_337, max_digits=recipe.max_digits)
    train = sample(policy, models.tokenizer, problems[: args.train_prompts], limit, args.group, 1, args.signal_top_k)
    heldout = sample(policy, models.tokenizer, problems[args.train_prompts :], limit, args.group, 2, args.signal_top_k)
    keys = [(0, tuple(r.prompt_ids)) for r in heldout]
    print(f"# {len(train)} training, {len(heldout)} held-out rollouts of the drifted policy "
          f"({sum(len(r.completion_ids) for r in heldout)} held-out positions), signal top-{args.signal_top_k}, "
          f"batch {args.batch_size}; sampled in {time.perf_counter() - started:.0f}s", flush=True)

    scorer = DrafterScorer(1.0, 64, 1.0, torch.device("cpu"))
    entries = [to_buffered(r) for r in heldout]
    frozen = scorer.score_groups(models.drafter, entries, keys)
    print(f"frozen drafter: {frozen.mean:.4f} ± {frozen.se:.4f}")
    print("| lr | steps | kl | tv | tv − kl | kl − frozen | tv − frozen |")
    print("|---|---|---|---|---|---|---|")
    for lr in args.lrs:
        learners = {}
        for loss in ("kl", "tv"):
            config = LearnerConfig(lr=lr, loss=loss, batch_size=args.batch_size, max_steps=0, seed=0,
                                   holdout_fraction=1 / 64, reset_margin=1.0)
            learners[loss] = DraftLearner(models.drafter, config)
            learners[loss].add_rollouts(train)
        done = 0
        for block in args.blocks:
            scores = {}
            for loss, learner in learners.items():
                learner.config.max_steps = block - done
                learner.train_round()
                scores[loss] = scorer.score_groups(learner.candidate.model, entries, keys)
            done = block
            d = paired_gain(scores["tv"], scores["kl"])
            dk, dt = paired_gain(scores["kl"], frozen), paired_gain(scores["tv"], frozen)
            print(f"| {lr:g} | {block} | {scores['kl'].mean:.4f} | {scores['tv'].mean:.4f} | "
                  f"{d.mean:+.4f} ± {d.se:.4f} | {dk.mean:+.4f} ± {dk.se:.4f} | {dt.mean:+.4f} ± {dt.se:.4f} |",
                  flush=True)
    print(f"# done in {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
