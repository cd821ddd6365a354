"""specroll.demo — the embedded demo world: a task, its reward, a tokenizer and small trained models.

No weights can be downloaded where specroll runs its demo and tests, so it builds its own:

- `task`: multi-digit addition with a scratchpad in two styles (verbose majority, compact minority);
  `make_problems`, `make_prompts`, `to_messages`, `solution`, `parse_problem`.
- `reward`: `arithmetic_reward` / `make_reward(RewardConfig)`, TRL's reward-function shape; pays
  for exact correctness and brevity, so GRPO moves the policy toward the compact style.
- `tokenizer`: `build_tokenizer()`, a character-level `PreTrainedTokenizerFast` with a chat template.
- the subword world (`DemoRecipe.bpe()`, `demo.world`): `bpe` (a 32,768-entry byte-level BPE trained
  here on `corpus`, synthetic text over a Zipf-ranked pseudo-word lexicon) and `story` (the addition task
  as word problems worked in sentences, long-tailed lengths); `vocab_stats` measures how much of the
  vocabulary the task's completions use.
- `model_cache`: `load_or_build_demo_models(recipe, cache_dir)` → `DemoModels` (target, drafter,
  tokenizer), cached under `$SPECROLL_CACHE` by recipe hash; `DemoRecipe.tiny()` for tests.
"""

import importlib

# name -> submodule; imported on first use, so `specroll build-demo-models --help` answers before torch loads
_EXPORTS = {
    "DemoModels": "model_cache", "build_demo_models": "model_cache", "load_or_build_demo_models": "model_cache",
    "DemoRecipe": "recipe",
    "RewardConfig": "reward", "arithmetic_reward": "reward", "make_reward": "reward",
    "Problem": "task", "Style": "task", "make_problems": "task", "make_prompts": "task", "solution": "task",
    "to_messages": "task",
    "build_tokenizer": "tokenizer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
