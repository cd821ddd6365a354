"""The block drafter in the engine: exact, one forward per step, drafting the q its training computes.

Greedy: a fresh block head (and one trained online through `make_online_learner`) gives plain decoding's tokens on
Llama (sdpa, eager: HF's forward), Qwen2 and Qwen3 (lean forward) — the EAGLE-3 tests' architectures — alone and
with the suffix drafter, at fixed and auto γ; the other verified architectures are the slow sweep. The plumbing:
verification captures the outputs of the head's target layers (HF's `hidden_states[l + 1]`); the drafts' q are
exactly the teacher-forced block's (`heads.block_scorer.BlockScorer.block_log_q`, what the learner trains); one
block forward per step whatever γ; at most one host sync per steady step (tests/test_engine_syncs.py's counter).
"""

from __future__ import annotations

import pytest
import torch
from test_engine_syncs import COUNTED_STEPS, syncs_per_step
from tiny_models import make_prompts, tiny_lm

from specroll.online_drafter import LearnerConfig, make_online_learner
from specroll.online_drafter.heads.block_learner import BlockLearner
from specroll.online_drafter.heads.block_scorer import BlockScorer
from specroll.online_drafter.heads.data import FeatureBatch
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.block_head import BlockHead, default_layers
from specroll.rollout.gamma.cost_model import CostModel
from specroll.rollout.models.architectures import VERIFIED_MODEL_TYPES
from specroll.rollout.models.timing import ForwardTimes
from specroll.tools.arch_sweep import prompts as sweep_prompts
from specroll.tools.arch_sweep import tiny_model

PROMPTS = make_prompts(12, 1, 9)  # one-token prompts included: a row with no context yet
GREEDY = SamplingParams(max_new_tokens=20, temperature=0)
ARCHS = [("llama", "sdpa", 4), ("llama", "eager", 4), ("qwen2", "sdpa", 6), ("qwen3", "sdpa", 5)]


def plain(target, prompts=PROMPTS) -> list[list[int]]:
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=0))
    return [r.completion_ids for r in engine.generate(prompts, GREEDY)]


def speculative(target, head=None, prompts=PROMPTS, **config) -> list[list[int]]:
    fields = dict(max_batch_size=5, max_seq_len=40, gamma=3, drafters=("block",), block_size=4,
                  cost_model_budget_s=0.3)
    engine = SpecEngine(target, head, EngineConfig(**{**fields, **config}))
    return [r.completion_ids for r in engine.generate(prompts, GREEDY)]


def trained(target, block_size: int = 4) -> BlockHead:
    """A head trained online (one gated round) on a fresh head's sampled rollouts."""
    config = EngineConfig(max_batch_size=8, max_seq_len=48, gamma=3, drafters=("block",), record_signals=True)
    head = BlockHead.for_target(target.config, block_size=block_size, seed=0)
    learner = make_online_learner(head, target, LearnerConfig(lr=3e-3, max_steps=40, batch_size=8, warmup_steps=0,
                                                              gate_z=0.0))
    assert isinstance(learner, BlockLearner)
    learner.add_rollouts(SpecEngine(target, head, config).generate(
        make_prompts(32, 2, 8, seed=3), SamplingParams(max_new_tokens=24, temperature=1.0, seed=2), n=2))
    assert learner.train_round().published
    out = BlockHead.for_target(target.config, block_size=block_size, seed=9)
    out.load_state_dict(learner.published_state_dict())
    return out


@pytest.mark.parametrize(("arch", "attn", "layers"), ARCHS)
@pytest.mark.parametrize("drafters", [("block",), ("dflash", "suffix")], ids="+".join)
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_greedy_equals_plain_decoding(arch, attn, layers, drafters, gamma):
    target = tiny_lm(arch, attn, layers=layers)
    assert speculative(target, drafters=drafters, gamma=gamma) == plain(target)


def test_trained_online_it_drafts_better_and_stays_exact():
    target = tiny_lm("llama", "sdpa", layers=4)
    head = trained(target)
    config = EngineConfig(max_batch_size=8, max_seq_len=48, gamma=3, drafters=("block",))
    acceptance = []
    for drafter in (BlockHead.for_target(target.config, block_size=4, seed=0), head):
        engine = SpecEngine(target, drafter, config)
        engine.generate(make_prompts(24, 2, 8, seed=4), SamplingParams(max_new_tokens=24, temperature=1.0, seed=2))
        acceptance.append(engine.stats.acceptance_rate)
    assert acceptance[1] > acceptance[0] + 0.03
    assert speculative(target, head) == plain(target)


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "attn", "layers"), ARCHS)
def test_trained_head_is_exact_on_each_architecture(arch, attn, layers):
    target = tiny_lm(arch, attn, layers=layers)
    assert speculative(target, trained(target)) == plain(target)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(VERIFIED_MODEL_TYPES))
def test_greedy_exact_on_every_verified_architecture(model_type):
    target = tiny_model(model_type)
    rows = sweep_prompts(2)
    assert speculative(target, prompts=rows, max_batch_size=3) == plain(target, rows)


def test_paged_cache_chunked_prefill_and_a_wide_block_stay_exact():
    target = tiny_lm("llama", "sdpa", layers=4)
    expected = plain(target)
    assert speculative(target, kv_cache="paged", kv_block_size=4, prefill_chunk_tokens=8) == expected
    assert speculative(target, block_size=9, gamma=8) == expected


def test_captured_states_are_the_target_layers_outputs():
    target = tiny_lm("llama", "eager", layers=5)  # HF's forward
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=4, max_seq_len=40, gamma=3, drafters=("block",),
                                                   block_layers=(0, 2, 3), block_size=4))
    steps = engine.generate_steps(PROMPTS[:4], SamplingParams(max_new_tokens=12, temperature=1.0, seed=0))
    for _ in range(3):
        next(steps)
    rows = engine.rows
    for b in range(4):
        length = int(rows.seq_len[b])
        with torch.no_grad():
            states = target.model(rows.tokens[b : b + 1, : length - 1], output_hidden_states=True).hidden_states
        expected = torch.cat([states[i + 1][0] for i in (0, 2, 3)], -1)  # the outputs of layers 0, 2, 3
        torch.testing.assert_close(rows.hidden[b, : length - 1], expected, atol=1e-5, rtol=1e-4)


def test_drafts_have_the_q_of_the_teacher_forced_block_and_one_forward_per_step():
    target = tiny_lm("llama", "sdpa", layers=4)
    head = BlockHead.for_target(target.config, block_size=5, seed=3)
    engine = SpecEngine(target, head, EngineConfig(max_batch_size=3, max_seq_len=40, gamma=4))
    steps = engine.generate_steps([PROMPTS[1], PROMPTS[5], PROMPTS[7]],
                                  SamplingParams(max_new_tokens=15, temperature=1.0, seed=1))
    next(steps)
    next(steps)  # the head's context is caught up to the first step, one step behind the rows
    rows, drafter = engine.rows, engine.drafter
    before = drafter.num_forwards
    proposal = drafter.propose(slice(0, 3), rows, 4, SamplingParams(max_new_tokens=1), lambda q, i: q.argmax(-1))
    assert drafter.num_forwards == before + 1 and proposal.drafts.shape == (3, 4)
    scorer = BlockScorer(target.get_input_embeddings(), target.get_output_embeddings(), 1.0, 4, 1.0,
                         torch.device("cpu"))
    for b in range(3):
        length = int(rows.seq_len[b])
        tokens = rows.tokens[b : b + 1, :length]
        batch = FeatureBatch(tokens, rows.hidden[b : b + 1, : length - 1], None, None, None)
        with torch.no_grad():
            log_q = scorer.block_log_q(drafter.head, batch, torch.tensor([[length - 1]]))  # [1, 4, V]
        torch.testing.assert_close(log_q[0].exp(), proposal.q.probs[b], atol=1e-5, rtol=1e-4)


def test_time_drafts_prices_any_gamma_at_one_block_forward(monkeypatch):
    target = tiny_lm("llama", "sdpa", layers=2)
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=4, max_seq_len=96, gamma=3, drafters=("block",)))
    drafter = engine.drafter
    forwards: dict[tuple[int, int], int] = {}

    def fake_timing(draft, batch_sizes, deadline, device):
        for batch in batch_sizes:
            for samples in (1, 2):
                before = drafter.num_forwards
                draft(batch, samples)
                forwards[batch, samples] = drafter.num_forwards - before
        return ForwardTimes(batch_sizes, [1, 2], [[0.010 * b, 0.0101 * b] for b in batch_sizes])

    monkeypatch.setattr("specroll.rollout.drafters.block.time_draft_calls", fake_timing)
    times = drafter.time_drafts([1, 4], deadline=0.0)
    assert set(forwards.values()) == {1}  # one block forward, whatever the number of drafts sampled from it
    assert times.query_lens == [1, 2]
    # The catch-up column is the block forward (and a sample), the per-draft column one more sample.
    torch.testing.assert_close(torch.tensor(times.times), torch.tensor([[0.0001, 0.010], [0.0004, 0.040]]))
    assert drafter.cache.host_lens == [0] * 4 and int(drafter.cache.lens.sum()) == 0
    cost = CostModel(target=times, drafter=times)  # auto-γ's reading: one block forward, then a sample per draft
    assert [round(cost.draft_time(1, g), 6) for g in range(1, 8)] == [round(0.010 + 0.0001 * (g - 1), 6)
                                                                       for g in range(1, 8)]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_one_host_sync_per_steady_step(gamma, temperature, monkeypatch):
    config = EngineConfig(max_batch_size=8, max_seq_len=96, gamma=gamma, max_gamma=6, cost_model_budget_s=0.2,
                          drafters=("block",), block_size=7)
    engine = SpecEngine(tiny_lm("llama", "sdpa", layers=2), None, config)
    counter = syncs_per_step(engine, SamplingParams(max_new_tokens=64, temperature=temperature, seed=0), monkeypatch)
    assert counter.total <= COUNTED_STEPS, dict(counter.sites)


def test_default_layers_spread_as_dflash_and_stay_below_the_last():
    assert default_layers(36, 5) == (1, 9, 17, 25, 33)  # z-lab's build_target_layer_ids(36, 5)
    assert default_layers(4) == (1,) and default_layers(2) == (0,)
    with pytest.raises(ValueError, match=">= 2 layers"):
        default_layers(1)


@pytest.mark.parametrize(("fields", "match"), [
    (dict(block_size=1), "block_size=1 is invalid"), (dict(block_layers=(2, 1)), "block_layers"),
    (dict(gamma=5, block_size=4), "at most block_size - 1 = 3"),
])
def test_bad_config_is_refused_naming_the_field(fields, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(drafters=("block",), **fields)


def test_the_config_caps_max_gamma_and_layers_must_fit_the_target():
    assert EngineConfig(drafters=("dflash",), block_size=5, gamma="auto").max_gamma == 4
    assert EngineConfig(drafters=("dflash",)).drafters == ("block",)
    target = tiny_lm("llama", "sdpa", layers=4)
    with pytest.raises(ValueError, match=r"block layers \[1, 3\] do not fit a target of 4 layers"):
        SpecEngine(target, None, EngineConfig(max_batch_size=2, max_seq_len=40, drafters=("block",),
                                              block_layers=(1, 3)))
    head = BlockHead.for_target(target.config, layers=(0, 2))
    with pytest.raises(ValueError, match=r"engine.block_layers=\(1,\) does not match"):
        SpecEngine(target, head, EngineConfig(max_batch_size=2, max_seq_len=40, block_layers=(1,)))


def test_a_draft_vocabulary_is_exact_and_drafts_only_its_ids():
    target = tiny_lm("llama", "sdpa", layers=4)
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=5, max_seq_len=40, gamma=3, drafters=("block",),
                                                   block_size=4, draft_vocab=20))
    ids = engine.draft_vocab()
    steps = engine.generate_steps(PROMPTS[:5], SamplingParams(max_new_tokens=10, temperature=1.0, seed=0))
    next(steps)
    proposal = engine.drafter.propose(slice(0, 5), engine.rows, 3, SamplingParams(max_new_tokens=1, temperature=1.0),
                                      lambda q, i, vocab: vocab[q.argmax(-1)])
    assert bool(torch.isin(proposal.drafts, ids).all()) and proposal.q.probs.shape[-1] == 20
    steps.close()
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)] == plain(target)


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=24, temperature=1.0, stop_token_ids=(3,), seed=11),
                                    SamplingParams(max_new_tokens=24, temperature=0.7, top_k=8, seed=12),
                                    SamplingParams(max_new_tokens=24, temperature=1.3, top_p=0.8, seed=13)],
                         ids=["T1", "T0.7-k8", "T1.3-p0.8"])
def test_invariant_sampler_output_is_plain_decodings_for_the_seed(params):
    """The drafts are drawn with the position's token noise, so the invariant rule emits plain decoding's tokens."""
    target = tiny_lm("llama", logit_scale=15.0)
    prompts = make_prompts(12, 2, 9, seed=4)
    config = dict(max_batch_size=5, max_seq_len=64, sampler="invariant")
    plain_tokens = SpecEngine(target, None, EngineConfig(**config, gamma=0)).generate(prompts, params, n=2)
    engine = SpecEngine(target, None, EngineConfig(**config, gamma=3, drafters=("block",), block_size=4))
    assert [r.completion_ids for r in engine.generate(prompts, params, n=2)] == [r.completion_ids for r in plain_tokens]
    assert engine.stats.drafted > 0
