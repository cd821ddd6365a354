"""Token trees through the engine: greedy exactness, invariant spec == plain, syncs, stats, shape and refusals.

Greedy exactness with trees is checked against HF `generate` (the greedy test's reference, `test_engine_greedy`):
a representative few cases in the default suite — each drafter regime, lean and HF forwards, dense and paged,
the model and the suffix + model tree — and the full matrix (every (architecture, attention) pair × drafter ×
width, and every allowlisted model type of the architecture sweep) under `slow`.
"""

from __future__ import annotations

import pytest
import torch
from test_engine_greedy import ARCH_ATTN, NEW_TOKENS, PROMPTS, hf_greedy, make_drafter
from test_engine_syncs import SyncCounter
from tiny_models import make_prompts, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.config import SuffixConfig
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads
from specroll.rollout.drafters.heads.block import BlockHead
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head
from specroll.rollout.models.architectures import VERIFIED_MODEL_TYPES
from specroll.tools import arch_sweep

GREEDY = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0)


def tree_engine(arch: str, attn: str, drafter, batch: int, gamma: int, width: int, **config) -> SpecEngine:
    return SpecEngine(tiny_lm(arch, attn), drafter, EngineConfig(max_batch_size=batch, max_seq_len=40, gamma=gamma,
                                                                 tree_width=width, **config))


def check_greedy(drafter_kind: str, gamma: int, width: int, batch: int, arch: str, attn: str, **config) -> SpecEngine:
    num_prompts = 5 if batch == 1 else len(PROMPTS)
    engine = tree_engine(arch, attn, make_drafter(drafter_kind, arch, attn), batch, gamma, width, **config)
    rollouts = engine.generate(PROMPTS[:num_prompts], GREEDY)
    assert tuple(tuple(r.completion_ids) for r in rollouts) == hf_greedy(arch, attn)[:num_prompts]
    assert engine.stats.tree_steps == engine.stats.steps > 0  # every step verified a tree
    assert engine.stats.tree_nodes_per_row == gamma * width
    return engine


DEFAULT_CASES = [  # (drafter, γ, width, batch, architecture, attention, extra config)
    ("partial", 3, 3, 7, "llama", "sdpa", {}),
    ("random", 4, 2, 1, "qwen3", "eager", {}),
    ("self", 2, 4, 32, "qwen2", "sdpa", {}),
    ("partial", 3, 2, 7, "llama", "eager", {"kv_cache": "paged", "kv_block_size": 4}),
    ("random", 3, 3, 7, "qwen2", "eager", {"drafters": ("suffix", "model")}),
]


@pytest.mark.parametrize(("drafter_kind", "gamma", "width", "batch", "arch", "attn", "config"), DEFAULT_CASES)
def test_tree_greedy_equals_hf_generate(drafter_kind, gamma, width, batch, arch, attn, config):
    engine = check_greedy(drafter_kind, gamma, width, batch, arch, attn, **config)
    if drafter_kind == "self":  # the drafter's first choice is the target's everywhere: the whole path is kept
        assert engine.stats.accepted == engine.stats.drafted > 0


@pytest.mark.slow
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("drafter_kind", ["self", "random", "partial"])
@pytest.mark.parametrize(("arch", "attn"), ARCH_ATTN)
def test_tree_greedy_matrix(drafter_kind, width, arch, attn):
    check_greedy(drafter_kind, 3, width, 7, arch, attn)
    check_greedy(drafter_kind, 3, width, 7, arch, attn, kv_cache="paged", kv_block_size=4)


RECURRENT_TYPES = {"bamba", "falcon_h1", "falcon_mamba", "granitemoehybrid", "mamba", "mamba2", "nemotron_h",
                   "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next"}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(VERIFIED_MODEL_TYPES))
def test_tree_greedy_every_allowlisted_type(model_type):
    """Trees on every type the architecture sweep verifies: exact against HF generate, or refused at construction
    (recurrent layers) with the error naming the type."""
    try:
        target, drafter = arch_sweep.tiny_model(model_type, 0), arch_sweep.tiny_model(model_type, 1)
    except (ValueError, KeyError) as err:  # a type the installed transformers lacks
        pytest.skip(f"the installed transformers cannot build model type {model_type!r}: {err}")
    rows = arch_sweep.prompts()
    config = EngineConfig(max_batch_size=len(rows), max_seq_len=max(map(len, rows)) + arch_sweep.NEW_TOKENS,
                          gamma=arch_sweep.GAMMA, tree_width=3)
    params = SamplingParams(max_new_tokens=arch_sweep.NEW_TOKENS, temperature=0)
    if model_type in RECURRENT_TYPES:
        with pytest.raises(ValueError, match=rf"model_type '{model_type}\w*' keeps recurrent"):
            SpecEngine(target, drafter, config)
        return
    expected = arch_sweep.hf_greedy(target, rows)
    for draft in (target, drafter):
        engine = SpecEngine(target, draft, config)
        assert [r.completion_ids for r in engine.generate(rows, params)] == expected


INVARIANT_CASES = [
    ("model", "dense", SamplingParams(48, temperature=1.0, seed=3)),
    ("model", "paged", SamplingParams(48, temperature=0.7, top_k=5, seed=4)),
    ("suffix+model", "dense", SamplingParams(48, temperature=1.3, top_p=0.9, seed=5)),
]


@pytest.mark.parametrize(("kinds", "kv", "params"), INVARIANT_CASES, ids=[f"{k}-{kv}" for k, kv, _ in INVARIANT_CASES])
def test_invariant_trees_give_plain_decodings_tokens(kinds, kv, params):
    prompts = make_prompts(6, 2, 9, seed=2)
    base = dict(max_batch_size=4, max_seq_len=64, sampler="invariant", kv_cache=kv, kv_block_size=4,
                suffix=SuffixConfig(min_survival=0.0))
    plain = SpecEngine(tiny_lm("llama", "sdpa"), None, EngineConfig(**base, gamma=0))
    expected = [r.completion_ids for r in plain.generate(prompts, params, n=2)]
    drafters = ("suffix", "model") if kinds == "suffix+model" else None
    engine = SpecEngine(tiny_lm("llama", "sdpa"), tiny_lm("llama", "sdpa", hidden=16, layers=1, seed=7),
                        EngineConfig(**base, gamma=3, tree_width=3, drafters=drafters))
    assert [r.completion_ids for r in engine.generate(prompts, params, n=2)] == expected
    assert engine.stats.tree_steps > 0 and 0.05 < engine.stats.acceptance_rate < 0.95


def head_drafter(kind: str, target):
    if kind == "eagle":
        return EagleHead.for_target(target.config, seed=3)
    if kind == "eagle3":
        return Eagle3Head.for_target(target.config, layers=(0, 1), seed=3, ttt_steps=1)
    if kind == "block":  # k = 4: a depth-3 tree is the block's 3 marginals
        return BlockHead.for_target(target.config, block_size=4, seed=3)
    return MedusaHeads(target.config.hidden_size, 3)


HEAD_TREES = [("eagle", 3, 3, 7), ("eagle", 2, 4, 1), ("eagle3", 3, 2, 7), ("medusa", 3, 3, 7), ("block", 3, 3, 7)]


@pytest.mark.parametrize(("kind", "gamma", "width", "batch"), HEAD_TREES)
def test_head_trees_greedy_equal_hf_generate(kind, gamma, width, batch):
    """EAGLE-2's tree on an EAGLE / EAGLE-3 head, Medusa's tree and a block's marginals as one (`propose_tree`):
    every step a tree, the output HF generate's."""
    target = tiny_lm("llama", "sdpa")
    num_prompts = 5 if batch == 1 else len(PROMPTS)
    engine = SpecEngine(target, head_drafter(kind, target), EngineConfig(
        max_batch_size=batch, max_seq_len=40, gamma=gamma, tree_width=width, drafters=(kind,)))
    rollouts = engine.generate(PROMPTS[:num_prompts], GREEDY)
    assert tuple(tuple(r.completion_ids) for r in rollouts) == hf_greedy("llama", "sdpa")[:num_prompts]
    assert engine.stats.tree_steps == engine.stats.steps > 0 and engine.stats.tree_nodes_per_row == gamma * width


@pytest.mark.parametrize("kind", ["eagle", "medusa", "block"])
def test_invariant_head_trees_give_plain_decodings_tokens(kind):
    prompts = make_prompts(6, 2, 9, seed=2)
    params = SamplingParams(40, temperature=1.0, seed=6)
    base = dict(max_batch_size=4, max_seq_len=64, sampler="invariant")
    plain = SpecEngine(tiny_lm("llama", "sdpa"), None, EngineConfig(**base, gamma=0))
    expected = [r.completion_ids for r in plain.generate(prompts, params, n=2)]
    target = tiny_lm("llama", "sdpa")
    engine = SpecEngine(target, head_drafter(kind, target),
                        EngineConfig(**base, gamma=3, tree_width=3, drafters=(kind,)))
    assert [r.completion_ids for r in engine.generate(prompts, params, n=2)] == expected
    assert engine.stats.tree_steps > 0 and engine.stats.accepted > 0


@pytest.mark.parametrize("kind", ["model", "suffix+model"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_tree_steps_copy_to_the_host_as_chain_steps_do(kind, temperature, monkeypatch):
    """One device→host copy per steady tree step (the model drafter), plus the suffix drafts' host→device copy."""
    target = tiny_lm("llama", "sdpa", layers=2)
    drafters = ("suffix", "model") if kind != "model" else None
    engine = SpecEngine(target, tiny_lm("llama", "sdpa", hidden=16, layers=1, seed=7),
                        EngineConfig(max_batch_size=8, max_seq_len=96, gamma=3, tree_width=3, drafters=drafters))
    prompts = make_prompts(4, 3, 9)
    counter = SyncCounter()
    with counter.patched(monkeypatch):
        steps = engine.generate_steps(prompts, SamplingParams(max_new_tokens=64, temperature=temperature, seed=0), n=2)
        for _ in range(2):
            next(steps)
        counter.active = True
        for _ in range(5):
            assert next(steps) == 8  # every row live: steady state
        counter.active = False
        steps.close()
    assert counter.total <= (1 if kind == "model" else 2) * 5, dict(counter.sites)


def test_auto_width_drafts_trees_where_the_batch_drained(monkeypatch):
    """tree_width='auto' runs end to end: the cost model's shape per step (where it chooses trees is
    `test_tree_shape`'s), trees run at one live row and what they kept is counted for the policy. The forward
    times are given (a target forward flat in its query length at one row, as a GPU's in the tail; drafts cheap)
    and the policies' online time corrections are off: measured in a busy test process, auto-γ may rightly decode
    plain and no tree would run (it did, at load ~4: 13 drafts in 357 steps)."""
    from tiny_models import noisy_copy

    from specroll.rollout.gamma import factory
    from specroll.rollout.gamma.cost_model import CostModel
    from specroll.rollout.gamma.tree_shape import AutoWidth
    from specroll.rollout.models.timing import ForwardTimes

    def flat(target, drafter, max_batch, max_gamma, budget_s, cache_dir=None, max_query=None):
        queries = list(range(1, (max_query or max_gamma + 1) + 1))
        return CostModel(target=ForwardTimes([1], queries, [[0.010 + 0.0001 * q for q in queries]]),
                         drafter=ForwardTimes([1], [1, 2], [[0.0005, 0.0006]]))

    monkeypatch.setattr(factory, "calibrate", flat)
    monkeypatch.setattr(CostModel, "observe", lambda self, *args, **kwargs: None)  # the chains' time corrections
    monkeypatch.setattr(AutoWidth, "offset", lambda self, rows, width: 0.0)  # the trees'
    engine = SpecEngine(tiny_lm("llama", "sdpa"), noisy_copy("llama", "sdpa", noise=0.3),
                        EngineConfig(max_batch_size=1, max_seq_len=160, gamma="auto", tree_width="auto",
                                     max_gamma=4, max_tree_width=3))
    engine.generate(make_prompts(3, 3, 6, seed=1), SamplingParams(max_new_tokens=120, temperature=1.0, seed=1))
    assert engine.stats.tree_steps > 0
    measured = {w: sum(rates.reached) for w, rates in engine.tree_policy.rates[False].items()}
    assert sum(measured.values()) > 0, measured  # the trees run taught the policy their acceptance


def test_the_chain_step_after_a_tree_step_is_a_catch_up_left_out_of_the_time_corrections(tmp_path):
    """A tree's drafter forwards move no drafter length, so the next chain step first catches the drafter up on the
    kept path (up to depth + 1 tokens). Timed, those steps made drafting look dearer after every tree step (the
    draft scale is one number), and an engine with trees drifted to plain decoding. As after a prefill or a plain
    step (`test_gamma_engine`), the policy learns acceptance from it, the time corrections nothing."""
    from tiny_models import noisy_copy

    engine = SpecEngine(tiny_lm("llama", "sdpa"), noisy_copy("llama", "sdpa", noise=0.3),
                        EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto", tree_width="auto", max_gamma=3,
                                     max_tree_width=2, calibration_cache=str(tmp_path), cost_model_budget_s=0.5))
    policy, trees = engine.gamma_policy, engine.tree_policy
    policy.choose = lambda shape, greedy: 2
    shapes = iter([(2, 1), (2, 2), (2, 1), (2, 1), (2, 2), (2, 2), (2, 1), (2, 1)] * 100)
    trees.choose = lambda shape, gamma, greedy: next(shapes)
    seen, timed = [], []
    observe, cost_observe = policy.observe, policy.cost.observe
    policy.observe = lambda shape, outcome, greedy: (seen.append(outcome), observe(shape, outcome, greedy))
    policy.cost.observe = lambda batch, gamma, *rest, **kw: (timed.append(gamma), cost_observe(batch, gamma, *rest,
                                                                                               **kw))
    engine.generate(make_prompts(4, 2, 6), SamplingParams(max_new_tokens=30, temperature=1.0, seed=0))
    assert engine.stats.tree_steps >= 3
    # chain steps: the first after the prefill, then after the tree, steady, after the two trees, steady
    assert [o.catch_up for o in seen[:5]] == [True, True, False, True, False]
    assert len(timed) >= 2 and len(timed) == sum(not o.catch_up for o in seen)


def test_tree_stats_count_nodes_and_kept_length():
    engine = tree_engine("llama", "sdpa", make_drafter("partial", "llama", "sdpa"), 7, 3, 2)
    engine.generate(PROMPTS[:7], GREEDY)
    stats = engine.stats.to_dict()
    assert stats["tree_nodes_per_row"] == 6 and stats["tree_steps"] == stats["steps"]
    assert stats["tree_accepted_len"] == pytest.approx(engine.stats.mean_accepted_len)
    assert sum(stats["tokens_per_step"]) == stats["generated_tokens"]


@pytest.mark.parametrize(("config", "match"), [
    (dict(tree_width="auto", gamma=3), r"tree_width='auto' is invalid: 'auto' needs gamma='auto'"),
    (dict(tree_width=17), r"tree_width=17 is invalid: an int in \[1, 16\]"),
    (dict(tree_width=0), r"tree_width=0 is invalid"),
    (dict(max_tree_width=0), r"max_tree_width=0 is invalid"),
])
def test_tree_config_is_validated(config, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**config)


def test_fixed_width_makes_room_for_the_tree():
    config = EngineConfig(max_seq_len=100, gamma=4, tree_width=3)  # max_gamma 8: up to 8 levels of 3
    assert config.max_step_drafts == 24 and config.cache_len == 100 + 24 + 2
    assert EngineConfig(max_seq_len=100, gamma="auto", tree_width="auto", max_tree_width=2).max_step_drafts == 16
    assert EngineConfig(max_seq_len=100, gamma=4).cache_len == 100 + 8 + 2  # chains: as before (max_gamma 8)


def test_trees_are_refused_for_a_drafter_that_proposes_none():
    target = tiny_lm("llama", "sdpa")
    with pytest.raises(ValueError, match=r"tree_width=2 is invalid with drafters \('layer_skip',\)"):
        SpecEngine(target, None, EngineConfig(max_batch_size=2, gamma=3, tree_width=2, drafters=("layer_skip",),
                                              layer_skip_layers=1))
    with pytest.raises(ValueError, match=r"tree_width=2 is invalid with drafters \('suffix',\)"):
        SpecEngine(target, None, EngineConfig(max_batch_size=2, gamma=3, tree_width=2, drafters=("suffix",)))


def test_chain_engines_are_unchanged_by_the_tree_machinery():
    engine = tree_engine("llama", "sdpa", make_drafter("partial", "llama", "sdpa"), 7, 3, 1)
    assert engine.tree_step is None and engine.tree_policy is None
    engine.generate(PROMPTS[:7], GREEDY)
    assert engine.stats.tree_steps == 0 and torch.is_tensor(engine.rows.tokens)
