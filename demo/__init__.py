"""specroll.demo — the embedded demo world: a task, its reward, a tokenizer and small trained models.

No weights can be downloaded where specroll runs its demo and tests, so it builds its own:

- `task`: multi-digit addition with a scratchpad in two styles (verbose majority, compact minority);
  `make_problems`, `make_prompts`, `to_messages`, `solution`, `parse_problem`.
- `reward`: `arithmetic_reward` / `make_reward(RewardConfig)`, TRL's reward-function shape; pays
  for exact correctness and brevity, so GRPO moves the policy toward the compact style.
- `tokenizer`: `build_tokenizer()`, a character-level `PreTrainedTokenizerFast` with a chat template.
- `models`: `load_or_build_demo_models(recipe, cache_dir)` → `DemoModels` (target, drafter,
  tokenizer), cached under `$SPECROLL_CACHE` by recipe hash; `DemoRecipe.tiny()` for tests.
"""

from .model_cache import DemoModels, build_demo_models, load_or_build_demo_models
from .recipe import DemoRecipe
from .reward import RewardConfig, arithmetic_reward, make_reward
from .task import Problem, Style, make_problems, make_prompts, solution, to_messages
from .tokenizer import build_tokenizer

__all__ = [
    "DemoModels",
    "DemoRecipe",
    "Problem",
    "RewardConfig",
    "Style",
    "arithmetic_reward",
    "build_demo_models",
    "build_tokenizer",
    "load_or_build_demo_models",
    "make_problems",
    "make_prompts",
    "make_reward",
    "solution",
    "to_messages",
]
