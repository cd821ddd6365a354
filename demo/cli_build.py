"""`specroll build-demo-models`: build (or rebuild) the demo's cached target, drafter and tokenizer.

Everything else builds the cache on first use; this command does it explicitly, e.g. before a
demo run or in a CI cache step, and prints where the models went and how long each stage took.
`--generic` also builds the demo's generic drafter (`demo.generic`), a separate artifact beside them.
"""

from __future__ import annotations

import argparse
import json

from .recipe import RECIPE_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="rebuild even if the cache already holds this recipe")
    parser.add_argument("--tiny", action="store_true", help="the tiny test recipe (seconds) instead of the full one")
    parser.add_argument(
        "--recipe", default=None, choices=RECIPE_NAMES,
        help="a named recipe (default: full; bpe is the subword world, about 11 min); --tiny is --recipe tiny",
    )
    parser.add_argument(
        "--cache-dir", default=None, help="cache folder (default: $SPECROLL_CACHE or ~/.cache/specroll)"
    )
    parser.add_argument("--generic", action="store_true", help="also the generic drafter (trained on the corpus "
                        "alone, never on the target's samples: demo.generic; configs/demo_generic.yaml serves it)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch CPU threads (default: torch's); 1 is often faster on a machine shared with other jobs",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from .model_cache import build_demo_models
    from .recipe import DemoRecipe

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads={args.threads} is invalid: an int >= 1")
        torch.set_num_threads(args.threads)
    if args.tiny and args.recipe not in (None, "tiny"):
        raise ValueError(f"--tiny with --recipe={args.recipe} is invalid: give one of them")
    name = "tiny" if args.tiny else args.recipe or "full"
    recipe = DemoRecipe.named(name)
    models = build_demo_models(recipe, args.cache_dir, progress=not args.no_progress, force=args.force)
    count = lambda model: sum(p.numel() for p in model.parameters())
    print(f"demo models ({name} recipe {recipe.hash}) at {models.path}")
    print(f"  target {count(models.target) / 1e6:.2f}M params, drafter {count(models.drafter) / 1e6:.2f}M params")
    print(f"  build log: {json.dumps(models.build_log)}")
    if args.generic:
        import shutil

        from .generic import generic_dir, load_or_build_generic_drafter

        if args.force:
            shutil.rmtree(generic_dir(models), ignore_errors=True)
        print(f"  generic drafter at {load_or_build_generic_drafter(models, progress=not args.no_progress)}")
    return 0
