"""specroll on vLLM (`integrations.vllm.VllmEngine`), through its public methods, on tiny fp32 Llamas.

One vLLM engine per module (a start costs ~15 s here): a 2-layer target and a 1-layer drafter LM that agrees with
it on about half the greedy tokens, γ = 3.
- Greedy: speculative output equals the target's greedy decoding token for token (Hugging Face's, fp32; peaked
  logits, so no near-ties), ragged prompts, n = 2, fresh and after a drafter refit.
- T = 1 and T = 0.7 with top-k 8: the emitted tokens follow the target's processed distribution — the conditional
  χ² of `distribution_stats` (exact p_t from one Hugging Face forward), 12,000 tokens per test, α = 1e-3. Power:
  the same test at T = 1 on vLLM's own CPU `expand_batch_to_tokens` (the defect `cpu_fixes` repairs) rejects H0,
  on 3,200 tokens (slow, as is T = 0.7: the default run keeps this module under a minute).
- Refit: a published version is served (every worker reports its digest); a version missing tensors is refused
  with nothing loaded; a drafter damaged in place (an injected loss) reports None until loaded again.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("vllm")

from distribution_stats import ALPHA, conditional_chi2_pvalue, reference_probs
from tiny_models import VLLM_SHAPE, build_lm, hf_greedy, make_prompts

from specroll.integrations.vllm import cpu_fixes
from specroll.integrations.vllm.engine import VllmEngine
from specroll.integrations.vllm.proposers import drafter_kind
from specroll.integrations.vllm.refusals import check_engine_config
from specroll.integrations.vllm.settings import VllmSettings
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.version import DrafterVersion

VOCAB = VLLM_SHAPE["vocab"]
SHAPE = VLLM_SHAPE
PROMPTS = make_prompts(6, 2, 7, vocab=VOCAB, seed=5)  # ragged: 2..7 tokens
ROWS, NEW_TOKENS = 1500, 8  # 12,000 sampled tokens per distribution test
POWER_ROWS = 400  # 3,200 tokens: the power check's p-value (vLLM's own CPU expand) is far below 1e-6 there


@pytest.fixture(scope="module")
def world():
    target = build_lm("llama", **SHAPE, layers=2, seed=21)
    drafter = build_lm("llama", **SHAPE, layers=1, seed=21)  # the target's embedding and head, one layer
    config = EngineConfig(gamma=3, drafters=("model",), max_batch_size=64, max_seq_len=64)
    engine = VllmEngine.from_models(target, drafter, config, VllmSettings(kv_cache_gib=1))
    yield target, drafter, engine
    del engine


def test_greedy_speculation_is_the_targets_greedy_fresh_and_after_a_refit(world):
    target, drafter, engine = world
    expected = [hf_greedy(target, p, 16) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    fresh = engine.generate(PROMPTS, params, n=2)
    assert [r.completion_ids for r in fresh] == [e for e in expected for _ in range(2)]
    assert 0 < sum(r.num_accepted for r in fresh) < sum(r.num_drafted for r in fresh)
    first_layer = {k: v.clone() for k, v in target.state_dict().items() if not k.startswith("model.layers.1")}
    refit = DrafterVersion(1, first_layer)  # the target's embedding, first layer and head
    engine.load_drafter(refit)
    assert engine.served_drafter_digests() == [refit.digest()]
    after = engine.generate(PROMPTS, params, n=2)
    assert [r.completion_ids for r in after] == [e for e in expected for _ in range(2)]
    engine.load_drafter(DrafterVersion(2, drafter.state_dict()))


def distribution_pvalue(engine, target, params: SamplingParams, rows: int = ROWS) -> float:
    prompts = make_prompts(rows, 3, 3, vocab=VOCAB, seed=9)
    rollouts = engine.generate(prompts, params)
    assert all(len(r.completion_ids) == NEW_TOKENS for r in rollouts)
    probs, tokens = reference_probs(target, rollouts, params)
    return conditional_chi2_pvalue(probs, tokens)


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=1),
    pytest.param(SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.7, top_k=8, seed=2), marks=pytest.mark.slow)],
    ids=["T1", "T0.7-top8"])
def test_sampled_tokens_follow_the_targets_distribution(world, params):
    target, _, engine = world
    assert distribution_pvalue(engine, target, params) > ALPHA


def test_acceptance_at_t1_is_specrolls_engines_with_the_same_drafter(world):
    """Drafts sampled from q with q handed to the rejection rule keep Σ min(p, q) of them, as specroll's engine
    does (vLLM's default greedy drafts would keep p(argmax q)); 12,000 tokens each, within 4 points."""
    target, drafter, engine = world
    prompts = make_prompts(ROWS, 3, 3, vocab=VOCAB, seed=9)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=4)
    ours = SpecEngine(target, drafter, EngineConfig(gamma=3, max_batch_size=64, max_seq_len=64))
    ours.generate(prompts, params)
    before = engine.stats.totals()
    engine.generate(prompts, params)
    theirs = engine.stats.since(before)
    assert abs(theirs.accepted / theirs.drafted - ours.stats.accepted / ours.stats.drafted) < 0.04


@pytest.mark.slow
def test_the_test_sees_vllms_own_cpu_expand(world, monkeypatch):
    import vllm.v1.sample.rejection_sampler as rejection_sampler

    if not cpu_fixes.defective():
        pytest.skip("this vLLM build's expand_batch_to_tokens is right: nothing to show")
    target, _, engine = world
    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", cpu_fixes.ORIGINAL_EXPAND)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=3)
    assert distribution_pvalue(engine, target, params, rows=POWER_ROWS) < 1e-6


def test_a_partial_drafter_version_is_refused_and_nothing_changes(world):
    _, drafter, engine = world
    served = engine.served_drafter_digests()
    partial = {k: v for k, v in drafter.state_dict().items() if "mlp" not in k}
    with pytest.raises(ValueError, match="not the whole model"):
        engine.load_drafter(DrafterVersion(9, partial))
    assert engine.served_drafter_digests() == served


def test_an_injected_loss_is_seen_and_a_reload_repairs_it(world):
    _, drafter, engine = world
    version = DrafterVersion(3, drafter.state_dict())
    engine.load_drafter(version)

    def drop_embedding(worker):  # what a wake without the drafter's weights leaves
        worker.model_runner.drafter.model.model.embed_tokens.weight.data.zero_()

    engine.llm.collective_rpc(drop_embedding)
    assert engine.served_drafter_digests() == [None]
    engine.load_drafter(version)
    assert engine.served_drafter_digests() == [version.digest()]


@pytest.mark.parametrize("change, field", [
    (dict(sampler="invariant"), "engine.sampler"), (dict(tree_width=2), "engine.tree_width"),
    (dict(gamma="auto_simple"), "engine.gamma"), (dict(draft_vocab=16), "engine.draft_vocab"),
    (dict(speculation="when_learned", gamma="auto"), "engine.speculation")])
def test_settings_vllm_cannot_honour_are_refused_naming_them(change, field):
    with pytest.raises(ValueError, match=field):
        check_engine_config(dataclasses.replace(EngineConfig(drafters=("model",)), **change))


def test_dflash_on_vllms_cpu_build_is_refused_before_anything_loads(tmp_path):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's DFlash proposer is refused on its CPU build only")
    with pytest.raises(ValueError, match=r"drafters=\['block'\].*CPU"):
        VllmEngine(str(tmp_path), str(tmp_path), EngineConfig(gamma=3, drafters=("block",)))


def test_drafter_kinds_without_a_vllm_proposer_are_refused_naming_those_that_have_one():
    for kinds in (("eagle",), ("medusa",), ("layer_skip",), ("suffix", "model")):
        with pytest.raises(ValueError, match=r"block.*eagle3.*model.*suffix"):
            drafter_kind(EngineConfig(drafters=kinds))
    assert drafter_kind(EngineConfig(drafters=("eagle3",))) == "eagle3"
