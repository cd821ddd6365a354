"""The engine's parts and seams (issue 59): `SpecEngine` holds its parts instead of inheriting mixins, its own state
is `state_dict()` with the drafter reporting its parts (`Drafter.learnt_state`), the dense cache answers the
admission questions a paged one does, and the CPU kernel's C++ ships as a file of the package."""

from __future__ import annotations

import importlib.resources
import tomllib
from pathlib import Path

import pytest
from tiny_models import make_prompts, noisy_copy, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.models.cache import RaggedKVCache
from specroll.rollout.models.paged_attention import SOURCE_PATH

GREEDY = SamplingParams(max_new_tokens=6, temperature=0)


def test_the_engine_holds_its_parts_instead_of_inheriting_them():
    assert SpecEngine.__bases__ == (object,)
    engine = SpecEngine(tiny_lm("llama"), noisy_copy("llama"), EngineConfig(max_batch_size=2, max_seq_len=32, gamma=2))
    engine.update_target({}, version=4)
    assert engine.policy_version == engine.weights.policy_version == 4
    assert engine.rows is engine.caches.rows and engine.memory is engine.caches.memory
    engine.release()
    assert engine.released and engine.caches.released and engine.rows is None
    engine.allocate()
    assert engine.generate(make_prompts(2, 3, 5), GREEDY)


def test_a_model_drafter_learns_nothing_to_resume_and_a_suffix_state_is_refused_naming_the_parts():
    engine = SpecEngine(tiny_lm("llama"), noisy_copy("llama"), EngineConfig(max_batch_size=2, max_seq_len=32, gamma=2))
    assert engine.drafter.learnt_state() == {}
    state = engine.state_dict()
    assert set(state) == {"format", "gamma_kind", "gamma", "tree"}
    engine.load_state_dict(state)
    suffix = SpecEngine(tiny_lm("llama"), noisy_copy("llama"),
                        EngineConfig(max_batch_size=2, max_seq_len=32, gamma=2, drafters=("suffix", "model")))
    saved = suffix.state_dict()
    assert {"suffix", "model_rates"} <= set(saved)
    with pytest.raises(ValueError, match=r"drafter kept \['model_rates', 'suffix'\] and this one's keeps nothing"):
        engine.load_state_dict(saved)
    engine.load_state_dict({**state, "suffix": None, "model_rates": None})  # a state saved with empty parts


def test_a_dense_cache_admits_every_request_and_shares_no_blocks():
    engine = SpecEngine(tiny_lm("llama"), None, EngineConfig(max_batch_size=2, max_seq_len=32, gamma=0))
    cache: RaggedKVCache = engine.target.cache
    cache.check_fits([10_000])
    assert cache.try_reserve(10_000) and cache.shareable_blocks(100) == 0
    with pytest.raises(ValueError, match="dense cache"):
        cache.share_prefix(0, 1, 1)


def test_the_kernel_source_is_package_data():
    shipped = importlib.resources.files("specroll.rollout.models") / "paged_attention.cpp"
    assert shipped.is_file() and Path(str(shipped)) == SOURCE_PATH
    assert "paged_attention_impl" in SOURCE_PATH.read_text()
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "paged_attention.cpp" in pyproject["tool"]["setuptools"]["package-data"]["specroll.rollout.models"]
