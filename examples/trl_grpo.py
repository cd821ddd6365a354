"""specroll as the rollout backend of your own TRL GRPOTrainer (in-process engine + online drafter).

    python examples/trl_grpo.py [--steps 4] [--out-dir runs/trl_grpo] [--tiny]

Trains the demo policy (built and cached on first use; `--tiny` for the seconds-long test recipe) for
a few GRPO steps with `SpecrollRolloutFunc` as its `rollout_func`; the trainer writes into `--out-dir`.
Swap in `AutoModelForCausalLM.from_pretrained(...)` for your own policy and drafter.
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps (default 4)")
    parser.add_argument("--out-dir", default="runs/trl_grpo", help="the trainer's output folder")
    parser.add_argument("--tiny", action="store_true", help="the tiny demo recipe instead of the full one")
    args = parser.parse_args()

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from specroll.demo.model_cache import load_or_build_demo_models
    from specroll.demo.recipe import DemoRecipe
    from specroll.demo.reward import make_reward
    from specroll.demo.task import make_prompts
    from specroll.integrations.local_backend import LocalBackend
    from specroll.integrations.trl_hook import SpecrollRolloutFunc
    from specroll.online_drafter import LearnerConfig
    from specroll.rollout import EngineConfig

    recipe = DemoRecipe.tiny() if args.tiny else DemoRecipe()
    demo = load_or_build_demo_models(recipe)  # or AutoModelForCausalLM.from_pretrained(...) for your own pair
    backend = LocalBackend.from_models(demo.target, demo.drafter, EngineConfig(gamma="auto"), LearnerConfig())
    policy = type(demo.target).from_pretrained(demo.path / "target")  # the trainer's own copy
    grpo_args = GRPOConfig(output_dir=args.out_dir, max_steps=args.steps, num_generations=4,
                           per_device_train_batch_size=16, max_completion_length=96, use_cpu=True, bf16=False,
                           report_to="none")
    trainer = GRPOTrainer(model=policy, reward_funcs=make_reward(), args=grpo_args, processing_class=demo.tokenizer,
                          train_dataset=Dataset.from_dict({"prompt": make_prompts(256, seed=0,
                                                                                  max_digits=recipe.max_digits)}),
                          rollout_func=SpecrollRolloutFunc(backend))
    trainer.train()


if __name__ == "__main__":
    main()
