"""The subword world's tiny recipe builds, caches and loads like the character world's (about a minute:
the 32k tokenizer, and the untrained target sampling to its length limit)."""

import pytest

from specroll.demo.model_cache import load_or_build_demo_models, models_dir
from specroll.demo.recipe import DemoRecipe
from specroll.demo.tokenizer import encode_prompt
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine


@pytest.mark.slow
def test_bpe_tiny_recipe_builds_models_on_the_32k_tokenizer(tmp_path):
    recipe = DemoRecipe.bpe_tiny()
    demo = load_or_build_demo_models(recipe, cache_dir=tmp_path, progress=False)
    assert demo.path == models_dir(recipe, tmp_path) and demo.recipe == recipe
    assert len(demo.tokenizer) == demo.target.config.vocab_size == demo.drafter.config.vocab_size == 32_768
    assert demo.build_log["tokenizer"]["vocab_size"] == 32_768
    assert set(demo.build_log) >= {"core SFT", "target SFT", "target sampling", "drafter distill", "total_seconds"}
    engine = SpecEngine(demo.target, demo.drafter, EngineConfig(max_batch_size=2, max_seq_len=64, gamma=2))
    prompt = encode_prompt(demo.tokenizer, [{"role": "user", "content": "Jox has 2 koonts."}])
    [rollout] = engine.generate([prompt], SamplingParams(max_new_tokens=8, temperature=0.0))
    assert len(rollout.completion_ids) == 8
