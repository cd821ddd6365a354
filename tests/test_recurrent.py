"""The recurrent (ReDrafter) drafter: exact greedy decoding with chains and beam-search trees on ragged batches, the
learner's objective aligned with what the engine drafts, a learner round that publishes to the engine, and its head
file round trip (`models.head`), own LM head included."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_prompts, tiny_lm

from specroll.integrations.head_file import save_head_file
from specroll.integrations.model_source import ModelPaths, load_drafter, trained_drafter_kind
from specroll.online_drafter import LearnerConfig, make_online_learner
from specroll.online_drafter.heads.data import collate, from_target
from specroll.online_drafter.heads.learner import HeadLearner
from specroll.online_drafter.heads.objectives import objective_for
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads import RecurrentHead
from specroll.rollout.drafters.recurrent import RecurrentDrafter, fresh_head
from specroll.rollout.drafters.registry import DRAFTERS, spec_for

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
PROMPTS = make_prompts(7, 1, 9)  # ragged, one a single token (no hidden state before its first step)


def trained_like(target, seed: int = 3, **kwargs) -> RecurrentHead:
    """A head with every weight random (a fresh one starts at the identity readout): drafts unlike the target's."""
    head = RecurrentHead.for_target(target.config, **kwargs)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in head.parameters():
            param.copy_(0.3 * torch.randn(param.shape, generator=gen))
    return head


@pytest.fixture(scope="module")
def plain():
    target = tiny_lm("llama", "sdpa")
    engine = SpecEngine(target, None, EngineConfig(max_batch_size=3, max_seq_len=40, gamma=0))
    return target, [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)]


def test_the_kind_is_registered_with_its_alias():
    spec = spec_for("redrafter")
    assert spec is DRAFTERS["recurrent"] and spec.trees and spec.draft_vocab and spec.reads_hidden and spec.trainable
    assert EngineConfig(drafters=("redrafter",)).drafters == ("recurrent",)
    with pytest.raises(ValueError, match="recurrent_own_head=True is invalid: False unless draft_vocab"):
        EngineConfig(recurrent_own_head=True)
    with pytest.raises(ValueError, match="recurrent_depths=0 is invalid: an int >= 1"):
        EngineConfig(recurrent_depths=0)


@pytest.mark.parametrize(("gamma", "width"), [(1, 1), (4, 1), (3, 2), (2, 4)])
def test_greedy_equals_plain_decoding_with_chains_and_beam_trees(plain, gamma, width):
    target, expected = plain
    config = EngineConfig(max_batch_size=3, max_seq_len=40, gamma=gamma, tree_width=width, drafters=("recurrent",))
    engine = SpecEngine(target, trained_like(target), config)
    assert isinstance(engine.drafter, RecurrentDrafter)
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)] == expected
    stats = engine.stats
    assert stats.drafted > 0 and (width == 1 or stats.tree_steps == stats.steps)


@pytest.mark.parametrize("width", [1, 3])
def test_greedy_beside_the_suffix_drafter_equals_plain_decoding(plain, width):
    """The per-row choice drafts some rows only (`RowIds`), a tree step both drafters' nodes: still plain's output."""
    target, expected = plain
    config = EngineConfig(max_batch_size=3, max_seq_len=40, gamma=3, tree_width=width, drafters=("suffix", "recurrent"))
    engine = SpecEngine(target, trained_like(target), config)
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY, n=2)] == [c for c in expected for _ in range(2)]
    assert engine.stats.by_drafter["recurrent"].proposals > 0


def test_greedy_over_a_draft_vocabulary_and_an_own_lm_head_equals_plain(plain):
    target, expected = plain
    config = EngineConfig(max_batch_size=3, max_seq_len=40, gamma=3, tree_width=2, drafters=("recurrent",),
                          draft_vocab=20, recurrent_own_head=True)
    head = fresh_head(config, target.config)
    assert head.draft_ids.numel() == 20 and head.lm_head.weight.shape[0] == 20
    engine = SpecEngine(target, head, config)
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)] == expected
    assert engine.stats.drafted > 0


def test_the_objective_scores_what_the_engine_drafts():
    """Depth d of the objective at position i is the readout the engine computes for its d-th draft after h_i when
    the drafts before it were the real tokens."""
    target = tiny_lm("llama", "sdpa")
    head = trained_like(target, depths=3)
    tokens = make_prompts(1, 12, 12, seed=2)[0]
    batch = collate([from_target(target, tokens, 4)])
    out = objective_for(head, target.get_input_embeddings(), target.get_output_embeddings())(head, batch, 1.0)
    ids = torch.tensor(tokens)
    embed = target.get_input_embeddings()
    with torch.no_grad():
        for i in (3, 6):
            h = batch.hidden[0, i]
            state = h
            for d in range(1, 4):
                state = head.cell(state, embed(ids[i + d]))
                torch.testing.assert_close(out.states[0, d - 1, i + d + 1], head.readout(h, state))


def test_a_learner_round_publishes_to_the_engine_and_the_head_file_round_trips(plain, tmp_path):
    target, expected = plain
    config = EngineConfig(max_batch_size=4, max_seq_len=40, gamma=3, drafters=("recurrent",), record_signals=True)
    head = fresh_head(config, target.config)
    engine = SpecEngine(target, head, config)
    learner = make_online_learner(head, target, LearnerConfig(lr=1e-2, max_steps=30, batch_size=4, warmup_steps=0,
                                                              ema_decay=0.0, gate_z=0.0, holdout_fraction=0.34))
    assert isinstance(learner, HeadLearner)
    for seed in range(3):
        learner.add_rollouts(engine.generate(make_prompts(6, 2, 6, seed=seed),
                                             SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed), n=2))
    report = learner.train_round()
    assert report.published and report.acceptance_after > report.acceptance_frozen_shadow
    version = learner.published_version()
    engine.load_drafter(version)
    assert engine.drafter_version == version.number >= 1
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY)] == expected

    trained = fresh_head(config, target.config)
    trained.load_state_dict(version.weights)
    save_head_file(tmp_path / "recurrent.pt", trained)
    paths = ModelPaths("the target is given", head=str(tmp_path / "recurrent.pt"))
    assert trained_drafter_kind(paths, config) == "recurrent"
    loaded = load_drafter(paths, config, target)
    assert SpecEngine(target, loaded, config).served_drafter_digest(loaded) == version.digest(config.dtype)
    with pytest.raises(ValueError, match=r"engine\.recurrent_mlp_layers=1 does not match the head"):
        load_drafter(paths, EngineConfig(drafters=("recurrent",), recurrent_mlp_layers=1), target)


def test_an_own_lm_head_starts_as_the_targets_rows_and_its_file_carries_its_ids(tmp_path):
    target = tiny_lm("llama", "sdpa")
    config = EngineConfig(drafters=("recurrent",), draft_vocab=24, recurrent_own_head=True)
    fresh = load_drafter(ModelPaths("the target is given"), config, target)
    assert torch.equal(fresh.lm_head.weight, target.lm_head.weight[fresh.draft_ids])
    save_head_file(tmp_path / "recurrent.pt", fresh, fresh.draft_ids)
    loaded = load_drafter(ModelPaths("the target is given", head=str(tmp_path / "recurrent.pt")), config, target)
    assert torch.equal(loaded.draft_ids, fresh.draft_ids) and torch.equal(loaded.lm_head.weight, fresh.lm_head.weight)


@pytest.mark.parametrize("own", [False, True], ids=["target_head", "own_head"])
def test_a_run_exports_the_head_with_the_engine_fields_that_read_it_back(tmp_path, own):
    """`export_drafter` writes `recurrent.pt` (an own LM head's file carrying that head's ids) and the `engine:`
    fields under which `models.head` loads it again."""
    from specroll.integrations.drafter_export import export_drafter

    target = tiny_lm("llama", "sdpa")
    config = EngineConfig(drafters=("recurrent",), recurrent_mlp_layers=1, draft_vocab=24 if own else None,
                          recurrent_own_head=own)
    head = load_drafter(ModelPaths("the target is given"), config, target)
    exported = export_drafter(head, "recurrent", target, tmp_path / "drafter")
    assert exported.engine == ({"recurrent_mlp_layers": 1, "draft_vocab": 24, "recurrent_own_head": True} if own
                               else {"recurrent_mlp_layers": 1})
    served = EngineConfig(drafters=("recurrent",), **exported.engine)
    loaded = load_drafter(ModelPaths("the target is given", head=str(exported.path)), served, target)
    assert all(torch.equal(t, head.state_dict()[name]) for name, t in loaded.state_dict().items())
