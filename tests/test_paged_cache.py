"""Paged KV cache (`models.paged`): the same logits as the dense cache, blocks that come and go, a memory budget.

Runner level: ragged prefill, lockstep decode, rollback by length and a row move through a paged cache give
the dense cache's logits (1e-6, fp32) and hand their blocks back. Engine level: greedy speculative decoding
through a paged target cache equals plain dense decoding token for token (model drafter, EAGLE, suffix +
model; n > 1 siblings sharing their prompt's blocks; a budget so small that requests wait for blocks), and
a seeded sampled run equals the dense one. A config that cannot fit its budget is refused at construction.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_lm, make_prompts, noisy_copy, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads import EagleHead
from specroll.rollout.models.architectures import VERIFIED_MODEL_TYPES
from specroll.rollout.models.paged import RESERVED_BLOCKS, PagedKVCache, PagedLayout
from specroll.rollout.models.runner import ModelRunner
from specroll.tools.arch_sweep import NEW_TOKENS, hf_greedy, prompts, tiny_model

CPU = torch.device("cpu")
ATOL = 1e-6


def runners(arch: str, attn: str, num_blocks: int = 40, block_size: int = 4):
    model = build_lm(arch, attn, logit_scale=1.0)
    dense = ModelRunner(model, batch=4, length=32, dtype=torch.float32, device=CPU)
    paged = ModelRunner(model, batch=4, length=32, dtype=torch.float32, device=CPU,
                        paged=PagedLayout(num_blocks, block_size))
    return dense, paged


@pytest.mark.parametrize(("arch", "attn"), [("llama", "sdpa"), ("qwen2", "eager"), ("qwen3", "sdpa")])
def test_paged_runner_matches_dense(arch, attn):
    dense, paged = runners(arch, attn)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(64, (3, 12), generator=gen)
    count = torch.tensor([5, 1, 9])
    live = slice(0, 3)
    torch.testing.assert_close(paged.extend(live, tokens, count), dense.extend(live, tokens, count), atol=ATOL, rtol=0)
    new = torch.randint(64, (3, 3), generator=gen)
    torch.testing.assert_close(paged.feed(live, new), dense.feed(live, new), atol=ATOL, rtol=0)
    for runner in (dense, paged):
        runner.rollback(live, runner.cache.lens[live] - torch.tensor([2, 0, 3]))
        runner.cache.move_row(2, 3)  # row 2 lives in slot 3 now
    rows = torch.tensor([0, 1, 3])
    new = torch.randint(64, (3, 2), generator=gen)
    torch.testing.assert_close(paged.feed(rows, new), dense.feed(rows, new), atol=ATOL, rtol=0)


def test_blocks_are_taken_as_rows_grow_and_given_back():
    _, paged = runners("llama", "sdpa", num_blocks=12, block_size=4)
    cache: PagedKVCache = paged.cache
    free = len(cache.free)
    paged.extend(slice(0, 2), torch.ones(2, 9, dtype=torch.long), torch.tensor([9, 2]))
    assert [len(t) for t in cache.tables[:2]] == [3, 1]  # ceil(9 / 4), ceil(2 / 4)
    assert len(cache.free) == free - 4
    cache.release_rows([0])
    assert len(cache.free) == free - 1
    cache.reset_rows(torch.tensor([1]))
    assert len(cache.free) == free == cache.capacity_blocks


def test_a_full_pool_refuses_reservations_and_writes():
    _, paged = runners("llama", "sdpa", num_blocks=RESERVED_BLOCKS + 3, block_size=4)
    cache: PagedKVCache = paged.cache
    assert cache.try_reserve(12) and not cache.try_reserve(1)  # 3 blocks reserved: none left
    with pytest.raises(RuntimeError, match="pool is exhausted"):
        paged.extend(slice(0, 2), torch.ones(2, 9, dtype=torch.long), torch.tensor([9, 9]))


PROMPTS = make_prompts(6, 2, 11)
GREEDY = SamplingParams(max_new_tokens=20, temperature=0)


def dense_plain(target, prompts=PROMPTS, n: int = 1, params=GREEDY) -> list[list[int]]:
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=6, max_seq_len=48, gamma=0))
    return [r.completion_ids for r in engine.generate(prompts, params, n=n)]


def paged_config(**fields) -> EngineConfig:
    return EngineConfig(**{"max_batch_size": 6, "max_seq_len": 48, "kv_cache": "paged", "kv_block_size": 4,
                           **fields})


@pytest.mark.parametrize("kind", ["plain", "model", "eagle", "suffix+model"])
def test_paged_greedy_equals_dense_plain(kind):
    target = tiny_lm("llama", "sdpa")
    drafter = {"plain": None, "model": noisy_copy("llama", "sdpa"), "suffix+model": noisy_copy("llama", "sdpa"),
               "eagle": EagleHead.for_target(target.config, seed=3)}[kind]
    config = paged_config(gamma=0 if kind == "plain" else 3,
                          drafters=("suffix", "model") if kind == "suffix+model" else None)
    engine = SpecEngine(target, drafter, config)
    got = [r.completion_ids for r in engine.generate(PROMPTS, GREEDY, n=2)]
    assert got == dense_plain(target, n=2)
    assert len(engine.target.cache.free) == engine.target.cache.capacity_blocks  # every block given back


def test_siblings_share_their_prompts_full_blocks():
    target = tiny_lm("qwen3", "eager")
    prompt = make_prompts(1, 11, 11, seed=4)  # 10 tokens cached at prefill: 2 full blocks of 4
    engine = SpecEngine(target, None, paged_config(gamma=0))
    steps = engine.generate_steps(prompt, GREEDY, n=4)
    next(steps)
    cache = engine.target.cache
    tables = cache.tables[:4]
    assert all(t[:2] == tables[0][:2] for t in tables)  # shared ...
    assert len({t[2] for t in tables}) == 4  # ... only the full ones
    assert [cache.refs[b] for b in tables[0][:2]] == [4, 4]
    for _ in steps:
        pass
    assert len(cache.free) == cache.capacity_blocks


def test_requests_wait_for_blocks_under_a_small_pool():
    target, drafter = tiny_lm("qwen2", "sdpa"), noisy_copy("qwen2", "sdpa")
    unbounded = SpecEngine(target, drafter, paged_config(gamma=2)).memory
    block = unbounded.target_kv // unbounded.kv_blocks
    rest = unbounded.total - unbounded.target_kv
    # Blocks for about two and a half rows at a time (each row reserves prompt + budget + drafts).
    engine = SpecEngine(target, drafter, paged_config(gamma=2, memory_budget=rest + 40 * block))
    cache = engine.target.cache
    assert cache.capacity_blocks < 6 * cache.blocks_for(11 + 20 + 3)  # not all six at once
    live = []
    steps = engine.generate_steps(PROMPTS, GREEDY)
    try:
        while True:
            live.append(next(steps))
    except StopIteration as done:
        got = [r.completion_ids for r in done.value]
    assert got == dense_plain(target)
    assert max(live) < len(PROMPTS)


def test_seeded_sampling_paged_equals_dense():
    target, drafter = tiny_lm("llama", "eager"), noisy_copy("llama", "eager")
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=11)
    runs = []
    for cache in ("dense", "paged"):
        engine = SpecEngine(target, drafter, EngineConfig(max_batch_size=6, max_seq_len=48, gamma=3, kv_cache=cache,
                                                          kv_block_size=4))
        runs.append([r.completion_ids for r in engine.generate(PROMPTS, params, n=2)])
    assert runs[0] == runs[1]


def test_a_config_that_cannot_fit_is_refused_naming_the_bytes():
    target = tiny_lm("llama", "sdpa")
    with pytest.raises(ValueError, match=r"memory_budget=100000 .*weights \d+ B.*target KV \d+ B.*drafter KV \d+ B"
                                         r".*recurrent state \d+ B.*workspace \d+ B"):
        SpecEngine(target, noisy_copy("llama", "sdpa"), EngineConfig(max_batch_size=6, max_seq_len=48,
                                                                     memory_budget=100_000))
    with pytest.raises(ValueError, match="memory_budget"):
        EngineConfig(memory_budget=-1)
    with pytest.raises(ValueError, match="kv_cache"):
        EngineConfig(kv_cache="ring")


@pytest.mark.parametrize("kernel", ["1", "0"])
def test_paged_engine_releases_and_allocates(kernel, monkeypatch):
    """Both read paths (the CPU kernel in place, or the gather into a workspace) free everything on `release`."""
    monkeypatch.setenv("SPECROLL_PAGED_KERNEL", kernel)
    target = tiny_lm("llama", "sdpa")
    engine = SpecEngine(target, None, paged_config(gamma=0))
    expected = engine.generate(PROMPTS, GREEDY)
    assert bool(engine.target.cache.space.buffers) == (kernel == "0")  # the gather reuses its workspace
    engine.release()
    assert not engine.target.cache.space.buffers and engine.target.cache.released
    engine.allocate()
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)] == [r.completion_ids for r in expected]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(VERIFIED_MODEL_TYPES))
def test_every_verified_architecture_is_exact_paged(model_type):
    """The architecture sweep's greedy check (plain, and the target drafting for itself), paged: attention layers
    of every kind (full, sliding-window, MLA, hybrids' attention) in blocks; recurrent rings stay dense."""
    target = tiny_model(model_type, seed=0)
    rows = prompts()
    expected = hf_greedy(target, rows)
    for drafter, gamma in ((None, 0), (target, 3)):
        config = EngineConfig(max_batch_size=len(rows), max_seq_len=max(map(len, rows)) + NEW_TOKENS, gamma=gamma,
                              kv_cache="paged", kv_block_size=4)
        engine = SpecEngine(target, drafter, config)
        got = engine.generate(rows, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0))
        assert [r.completion_ids for r in got] == expected, (model_type, gamma)


def extend_forward_sizes(engine: SpecEngine) -> list[int]:
    """Record the tokens of every forward `extend` makes (prefill, the drafter's catch-up), target and drafter."""
    fed = []
    for runner in (engine.target, engine.drafter.runner):
        forward = runner.forward

        def spy(rows, input_ids, *args, forward=forward, **kwargs):
            if kwargs.get("logits_at") is not None:  # extend's forwards ask for each row's last logits
                fed.append(input_ids.numel())
            return forward(rows, input_ids, *args, **kwargs)

        runner.forward = spy
    return fed


@pytest.mark.parametrize("kv_cache", ["dense", "paged"])
def test_chunked_prefill_stays_under_its_token_budget_and_changes_no_token(kv_cache):
    target, drafter = tiny_lm("llama", "sdpa"), noisy_copy("llama", "sdpa")
    sizes = {}
    for chunk in (None, 8):
        engine = SpecEngine(target, drafter, paged_config(gamma=3, kv_cache=kv_cache, prefill_chunk_tokens=chunk))
        sizes[chunk] = extend_forward_sizes(engine)
        assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY, n=2)] == dense_plain(target, n=2)
    assert max(sizes[None]) > 8  # unchunked, the first prefill feeds 6 rows × their longest prompt
    assert max(sizes[8]) <= 8


def test_kv_memory_benchmark_lockstep_pairs_the_same_tokens(study):
    """The speed benchmark's lockstep (`studies/kv_memory.py`) runs a dense and a paged engine through one
    generation each, stepped in turn: both emit the same greedy tokens and each is timed on its own steps."""
    _lockstep = study("kv_memory")._lockstep

    target = tiny_lm()
    engines = {kind: SpecEngine(target, None, EngineConfig(max_batch_size=4, max_seq_len=64, gamma=0, kv_cache=kind,
                                                           kv_block_size=4)) for kind in ("dense", "paged")}
    out = _lockstep(engines, make_prompts(3, 3, 8, seed=1), SamplingParams(max_new_tokens=9, temperature=0), n=2)
    assert out["dense"][2] == out["paged"][2] and len(out["dense"][2]) == 6
    assert all(tokens == 6 * 9 and seconds > 0 for tokens, seconds, _ in out.values())
