"""`specroll distill` against `demo.heads` at an equal budget, paired on the same held-out positions.

    python -m specroll.cli distill --policy <demo>/target --tokenizer <demo>/tokenizer --kind eagle \\
        --prompts specroll.demo.task:make_prompts --eagle-intermediate-size 512 --minutes 10 --out /tmp/distill_eagle
    python studies/distill_compare.py --distilled /tmp/distill_eagle/eagle.pt --minutes 10

It trains `demo.heads`'s EAGLE head (`online_drafter.offline.train_offline`, distill's own recipe) for the same
minutes on demo.heads' own samples of the demo target (its cached `samples.pt`, sampled and cached there first if
missing; the cached head itself is left as it is), then scores both heads on one held-out set: a head learner's
over those samples (every 4th prompt group, the newest `max_holdout_positions`), the prompts being the ones
distill draws with its default seed, in the same order, so the same groups are held out of both. Prints both,
the paired difference and whether the distilled head is within `--points` of the demo's: what differs is the
samples (distill's own sampling of the prompts it loads, against demo.heads' sampling of the same prompts).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--distilled", required=True, help="the head file specroll distill wrote (<out>/eagle.pt)")
    parser.add_argument("--minutes", type=float, default=10.0, help="the training budget both heads get")
    parser.add_argument("--recipe", default="full", help="the demo recipe whose target both heads serve")
    parser.add_argument("--points", type=float, default=3.0, help="the bar: within this many acceptance points")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=None, help="fewer prompts than demo.heads' (a smoke "
                        "run: its samples are then kept in memory, never in demo.heads' cache)")
    parser.add_argument("--samples", type=int, default=None, help="samples per prompt (as --num-prompts)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from specroll.demo.heads import (
        HeadTrainingSettings,
        heads_dir,
        sample_features,
        training_prompts,
    )
    from specroll.demo.model_cache import load_or_build_demo_models
    from specroll.demo.recipe import DemoRecipe
    from specroll.online_drafter import LearnerConfig
    from specroll.online_drafter.heads.data import FeatureSequence
    from specroll.online_drafter.heads.learner import HeadLearner
    from specroll.online_drafter.offline import train_offline
    from specroll.rollout.drafters.heads import EagleHead

    demo = load_or_build_demo_models(DemoRecipe.named(args.recipe))
    target = demo.target
    settings = HeadTrainingSettings(eagle_budget_s=args.minutes * 60)
    cached = args.num_prompts in (None, settings.prompts) and args.samples in (None, settings.samples)
    settings = replace(settings, prompts=args.num_prompts or settings.prompts, samples=args.samples or settings.samples)
    path = heads_dir(demo.path) / "samples.pt"
    if cached and path.is_file():
        sequences = [FeatureSequence(**fields) for fields in torch.load(path, weights_only=True)]
    else:
        prompts = training_prompts(demo.tokenizer, settings.prompts)
        sequences = sample_features(target, prompts, settings.samples, settings.max_new_tokens,
                                    (demo.tokenizer.eos_token_id,))
        if cached:  # demo.heads' own samples: kept where it keeps them
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save([asdict(s) for s in sequences], path)
    started = time.perf_counter()
    benchmark = EagleHead.for_target(target.config, intermediate_size=settings.eagle_intermediate_size)
    train_offline(benchmark, target, sequences, settings.schedule("eagle"), sum(s.num_positions for s in sequences))
    print(f"demo.heads's head: {time.perf_counter() - started:.0f}s", flush=True)
    weights = torch.load(args.distilled, weights_only=True)
    distilled = EagleHead.for_target(target.config, intermediate_size=int(weights["gate_proj.weight"].shape[0]))
    distilled.load_state_dict(weights)
    config = LearnerConfig(holdout_fraction=0.25)
    judge = HeadLearner(EagleHead.for_target(target.config, intermediate_size=settings.eagle_intermediate_size),
                        target.get_input_embeddings(), target.get_output_embeddings(), config)
    judge.add(sequences)
    ours, theirs = judge.score(distilled), judge.score(benchmark)
    gap = 100 * (theirs - ours)
    print(f"held-out expected acceptance ({sum(e.num_positions for e in judge.holdout.entries)} positions): "
          f"specroll distill {ours:.4f}, demo.heads {theirs:.4f}; distill is {abs(gap):.2f} points "
          f"{'below' if gap > 0 else 'above'} it: {'PASS' if gap <= args.points else 'FAIL'} (bar: within "
          f"{args.points:g} points)")


if __name__ == "__main__":
    main()
