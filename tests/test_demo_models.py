"""The demo models: function-preserving growth, the tiny recipe's build, its cache and its CLI."""

import argparse
import dataclasses

import pytest
import torch
from transformers import LlamaForCausalLM

from specroll.demo import cli_build, model_cache
from specroll.demo.build import llama_config
from specroll.demo.grow import grow, grown_config
from specroll.demo.model_cache import build_demo_models, load_demo_models, load_or_build_demo_models, models_dir
from specroll.demo.recipe import DemoRecipe, ModelShape, TrainStage
from specroll.demo.tokenizer import build_tokenizer
from specroll.demo.truncate import kept_layers, truncate
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine


@pytest.fixture(scope="module")
def tiny(tiny_demo_cache):
    """The session's tiny build (conftest.tiny_demo_cache), loaded from its cache."""
    return load_or_build_demo_models(DemoRecipe.tiny(), cache_dir=tiny_demo_cache, progress=False), tiny_demo_cache


def test_growth_preserves_the_core_function():
    torch.manual_seed(0)
    core = LlamaForCausalLM(llama_config(ModelShape(32, 2, 2, 64), build_tokenizer(), 64)).eval()
    with torch.no_grad():  # a trained-looking core: norms away from 1
        for name, param in core.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    big = grow(core, grown_config(core.config, 64, 5, 4, 160), seed=1).eval()
    ids = torch.randint(7, 100, (3, 20))
    with torch.no_grad():
        torch.testing.assert_close(big(input_ids=ids).logits, core(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    assert sum(p.numel() for p in big.parameters()) > 3 * sum(p.numel() for p in core.parameters())


def test_truncation_keeps_first_and_last_layers_and_runs():
    assert kept_layers(3, 2) == [0, 2]
    assert kept_layers(8, 3) == [0, 4, 7]
    torch.manual_seed(0)
    core = LlamaForCausalLM(llama_config(ModelShape(32, 3, 2, 64), build_tokenizer(), 64)).eval()
    whole, cut = truncate(core, 3).eval(), truncate(core, 2).eval()
    ids = torch.randint(7, 100, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(whole(input_ids=ids).logits, core(input_ids=ids).logits)
        assert cut(input_ids=ids).logits.shape == (2, 12, core.config.vocab_size)
    assert cut.config.num_hidden_layers == 2 and core.config.num_hidden_layers == 3
    with pytest.raises(ValueError, match="num_layers=4"):
        kept_layers(3, 4)


def test_tiny_build_saves_llama_models_and_tokenizer(tiny):
    demo, cache = tiny
    assert demo.path == models_dir(DemoRecipe.tiny(), cache)
    for sub in ("target", "drafter", "tokenizer", "recipe.json"):
        assert (demo.path / sub).exists()
    recipe = DemoRecipe.tiny()
    assert demo.target.config.hidden_size == recipe.target.hidden_size
    assert demo.target.config.num_hidden_layers == recipe.target.num_layers
    assert demo.drafter.config.num_hidden_layers == recipe.drafter.num_layers
    assert demo.target.config.vocab_size == demo.drafter.config.vocab_size == len(demo.tokenizer)
    assert set(demo.build_log) >= {"core SFT", "target SFT", "drafter SFT", "drafter distill", "total_seconds"}


def test_second_call_loads_from_cache_without_building(tiny, monkeypatch):
    _, cache = tiny
    monkeypatch.setattr(model_cache, "build", lambda *a, **k: pytest.fail("rebuilt a cached recipe"))
    again = load_or_build_demo_models(DemoRecipe.tiny(), cache_dir=cache, progress=False)
    assert again.path == models_dir(DemoRecipe.tiny(), cache)


def test_load_by_path_recovers_the_recipe(tiny):
    demo, _ = tiny
    assert load_demo_models(demo.path).recipe == DemoRecipe.tiny()


def test_a_changed_recipe_gets_its_own_folder():
    changed = dataclasses.replace(DemoRecipe.tiny(), compact_fraction=0.5)
    assert changed.hash != DemoRecipe.tiny().hash
    assert models_dir(changed, "/c") != models_dir(DemoRecipe.tiny(), "/c")


def test_cache_dir_defaults_to_the_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECROLL_CACHE", str(tmp_path))
    assert models_dir(DemoRecipe.tiny()).parent == tmp_path


def test_engine_decodes_with_the_built_pair(tiny):
    demo, _ = tiny
    engine = SpecEngine(demo.target, demo.drafter, EngineConfig(max_batch_size=4, max_seq_len=96, gamma=2),
                        demo.tokenizer, demo.tokenizer)
    prompt = demo.tokenizer.apply_chat_template([{"role": "user", "content": "12+3"}], add_generation_prompt=True)
    ids = prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt
    rollouts = engine.generate([ids], SamplingParams(max_new_tokens=8, temperature=1.0, seed=0), n=2)
    assert len(rollouts) == 2 and all(1 <= len(r.completion_ids) <= 8 for r in rollouts)


def test_cli_builds_into_the_given_cache(tiny, capsys):
    _, cache = tiny
    parser = argparse.ArgumentParser()
    cli_build.add_arguments(parser)
    assert cli_build.run(parser.parse_args(["--tiny", "--cache-dir", str(cache), "--no-progress"])) == 0
    assert str(models_dir(DemoRecipe.tiny(), cache)) in capsys.readouterr().out


def test_recipe_validation_names_the_field():
    with pytest.raises(ValueError, match="compact_fraction"):
        DemoRecipe(compact_fraction=1.5)
    with pytest.raises(ValueError, match="head_dim"):
        DemoRecipe(target=ModelShape(96, 2, 2, 128), core=ModelShape(32, 1, 2, 64), drafter=ModelShape(32, 1, 2, 64))
    with pytest.raises(ValueError, match="drafter="):
        DemoRecipe(drafter=ModelShape(128, 1, 2, 512))
    with pytest.raises(ValueError, match="steps"):
        TrainStage(-1, 8, 1e-3)


def test_build_demo_models_rejects_a_non_recipe(tmp_path):
    with pytest.raises(ValueError, match="recipe"):
        build_demo_models("tiny", cache_dir=tmp_path)


def test_a_first_run_says_it_builds_the_demo_models_where_and_about_how_long(tiny, monkeypatch, tmp_path, capsys):
    from specroll.jobs.backends import resolve_models
    from specroll.jobs.train_config import ModelsConfig, TrainConfig

    demo, cache = tiny
    monkeypatch.setenv("SPECROLL_CACHE", str(tmp_path))  # an empty cache: a first run
    monkeypatch.setattr(model_cache, "load_or_build_demo_models", lambda recipe: demo)  # the session's build
    sources = resolve_models(TrainConfig(models=ModelsConfig(recipe="tiny")))
    out = capsys.readouterr().out
    assert "building the demo models (tiny recipe, first run only: about 1 min" in out
    assert str(models_dir(DemoRecipe.tiny(), tmp_path)) in out
    assert sources.build_s > 0 and sources.paths.target == str(demo.path / "target")
    monkeypatch.setenv("SPECROLL_CACHE", str(cache))  # cached: silent, and no build time
    assert resolve_models(TrainConfig(models=ModelsConfig(recipe="tiny"))).build_s == 0
    assert "building" not in capsys.readouterr().out
