"""The closing speed measurement of `specroll train` starts its speculative engine where the run's engine is."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from specroll.demo.model_cache import load_or_build_demo_models
from specroll.demo.recipe import DemoRecipe
from specroll.demo.task import make_prompts
from specroll.integrations.local_backend import LocalBackend
from specroll.integrations.model_source import ModelPaths
from specroll.jobs.speed import closing_engines
from specroll.rollout import EngineConfig, SamplingParams
from specroll.rollout.engine import engine_state


@pytest.mark.parametrize("gamma", ["auto", "auto_simple"])
def test_the_speculative_engine_starts_from_the_run_engines_gamma_statistics(tiny_demo_cache, gamma):
    demo = load_or_build_demo_models(DemoRecipe.tiny(), cache_dir=tiny_demo_cache, progress=False)
    paths = ModelPaths(str(demo.path / "target"), str(demo.path / "drafter"))
    config = EngineConfig(max_batch_size=8, max_seq_len=64, gamma=gamma, max_gamma=3)
    target = AutoModelForCausalLM.from_pretrained(paths.target)
    backend = LocalBackend.from_models(target, AutoModelForCausalLM.from_pretrained(paths.drafter), config)
    prompts = [demo.tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)
               ["input_ids"] for p in make_prompts(4, seed=0, max_digits=3)]
    backend.generate(prompts, SamplingParams(max_new_tokens=16, temperature=1.0, seed=0), n=2)
    learnt = backend.engine_states()[0]["gamma"]
    fresh = engine_state(LocalBackend.from_models(target, AutoModelForCausalLM.from_pretrained(paths.drafter),
                                                  config).engine)["gamma"]
    with pytest.raises(AssertionError):
        torch.testing.assert_close(fresh, learnt)  # the run's engine learnt something a fresh one lacks

    spec, plain = closing_engines(config, paths, dict(target.named_parameters()), 3, backend)
    torch.testing.assert_close(engine_state(spec)["gamma"], learnt)
    assert spec.policy_version == 3 and plain.drafter is None and plain.target.model is spec.target.model
