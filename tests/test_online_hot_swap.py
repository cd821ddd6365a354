"""Hot swap: new target / drafter weights between `generate` calls, caches kept, versions recorded."""

from __future__ import annotations

import copy

import torch
from online_fixtures import tiny_llama

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.version import DrafterVersion

CONFIG = dict(max_batch_size=4, max_seq_len=32, gamma=3, record_signals=True, signal_top_k=4)
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)


def cache_storage(engine: SpecEngine) -> list[int]:
    caches = [engine.target.cache, engine.drafter.runner.cache]
    return [t.data_ptr() for c in caches for layer in c.layers for t in (layer.keys, layer.values)]


def test_swaps_keep_caches_and_rollouts_record_versions():
    target, drafter = tiny_llama(32, 2, seed=0), tiny_llama(16, 1, seed=1)
    engine = SpecEngine(target, drafter, EngineConfig(**CONFIG))
    storage = cache_storage(engine)
    first = engine.generate(PROMPTS, GREEDY)
    assert {(r.policy_version, r.drafter_version) for r in first} == {(0, 0)}

    new_target, new_drafter = tiny_llama(32, 2, seed=2), tiny_llama(16, 1, seed=3)
    engine.update_target({n: p.detach() for n, p in new_target.named_parameters()}, version=5)
    engine.load_drafter(DrafterVersion(2, {n: p.detach() for n, p in new_drafter.named_parameters()}))
    second = engine.generate(PROMPTS, GREEDY)
    assert {(r.policy_version, r.drafter_version) for r in second} == {(5, 2)}
    assert cache_storage(engine) == storage  # same buffers: nothing reallocated

    fresh = SpecEngine(copy.deepcopy(new_target), copy.deepcopy(new_drafter), EngineConfig(**CONFIG))
    assert [r.completion_ids for r in second] == [r.completion_ids for r in fresh.generate(PROMPTS, GREEDY)]
    for name, param in engine.drafter.runner.model.named_parameters():
        assert torch.equal(param, dict(new_drafter.named_parameters())[name])


def test_partial_target_update_changes_only_named_parameters():
    target, drafter = tiny_llama(32, 2, seed=0), tiny_llama(16, 1, seed=1)
    engine = SpecEngine(target, drafter, EngineConfig(**CONFIG))
    before = {n: p.detach().clone() for n, p in engine.target.model.named_parameters()}
    name = "model.layers.0.mlp.down_proj.weight"
    engine.update_target({name: torch.zeros_like(before[name])}, version=1)
    for n, p in engine.target.model.named_parameters():
        assert torch.equal(p, torch.zeros_like(p) if n == name else before[n]), n
    assert engine.generate(PROMPTS[:1], GREEDY)[0].policy_version == 1
