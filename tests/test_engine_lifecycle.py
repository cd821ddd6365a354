"""An engine's memory: freed at once when it is dropped, released and allocated again between rollout phases.

A trainer colocated with the engine wants the KV cache's memory back while it trains: `release()` frees the
caches (target and drafter K/V, recurrent state, per-row buffers), `allocate()` brings them back (zeroed),
weights stay. Measured by RSS (psutil) on a cache of ~130 MB, and by weak references to the buffers with
the cyclic garbage collector off (a reference cycle would keep them until it runs).
"""

from __future__ import annotations

import gc
import weakref

import psutil
import pytest
from tiny_models import build_lm, make_prompts

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

PROMPTS = make_prompts(4, 2, 6)
GREEDY = SamplingParams(max_new_tokens=8, temperature=0)
# 2 layers × K and V × 32 rows × 2 heads × 8,202 slots × 16 dims × 4 bytes ≈ 134 MB of target K/V.
BIG = dict(max_batch_size=32, max_seq_len=8192, gamma=2)


def big_engine() -> SpecEngine:
    target = build_lm("llama", "sdpa", hidden=64, layers=2, head_dim=16)
    drafter = build_lm("llama", "sdpa", hidden=16, layers=1, seed=7)
    return SpecEngine(target, drafter, EngineConfig(**BIG))


def kv_bytes(engine: SpecEngine) -> int:
    layers = engine.target.cache.buffered_layers
    return sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in layers)


def rss() -> int:
    return psutil.Process().memory_info().rss


def test_a_dropped_engine_frees_its_buffers_without_the_cyclic_collector():
    engine = big_engine()
    engine.generate(PROMPTS, GREEDY)
    buffers = [weakref.ref(engine.target.cache.buffered_layers[0].keys), weakref.ref(engine.rows.tokens),
               weakref.ref(engine.drafter.runner.cache.buffered_layers[0].values)]
    gc.collect()
    gc.disable()
    try:
        del engine
        assert [ref() is None for ref in buffers] == [True] * len(buffers)
    finally:
        gc.enable()


def test_release_returns_the_cache_memory_and_allocate_brings_it_back():
    engine = big_engine()
    expected = engine.generate(PROMPTS, GREEDY)
    held, size = rss(), kv_bytes(engine)
    engine.release()
    released = rss()
    assert held - released > 0.8 * size, (held, released, size)  # the K/V's pages went back to the OS
    engine.allocate()
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)] == [r.completion_ids for r in expected]
    assert rss() - released > 0.8 * size  # zeroed again: the pages are back


def test_generate_on_a_released_engine_is_refused():
    engine = big_engine()
    engine.release()
    assert engine.released
    with pytest.raises(RuntimeError, match=r"released.*allocate\(\)"):
        engine.generate(PROMPTS, GREEDY)
    engine.release()  # twice is harmless
    engine.allocate()
    engine.allocate()  # so is this
    assert not engine.released
    assert len(engine.generate(PROMPTS, GREEDY)) == len(PROMPTS)


def test_release_during_a_generation_is_refused():
    engine = big_engine()
    steps = engine.generate_steps(PROMPTS, GREEDY)
    next(steps)
    with pytest.raises(RuntimeError, match="generation"):
        engine.release()
    steps.close()
    engine.release()
