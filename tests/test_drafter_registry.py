"""The drafter-kind registry: every kind one spec (with the vLLM method that can serve it), and a new kind added as a
newcomer would add one — its own file (`toy_drafter.py`) and one `register` line — runs end to end: config, engine
generate (greedy equals plain decoding), a learner round, and a checkpoint round trip (head file → `load_drafter`)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_prompts, tiny_lm
from toy_drafter import TOY, BigramHead

from specroll.integrations.head_file import save_head_file
from specroll.integrations.model_source import ModelPaths, load_drafter, trained_drafter_kind
from specroll.online_drafter import LearnerConfig, make_online_learner
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.draft_vocab import DraftVocab
from specroll.rollout.drafters.registry import DRAFTERS, register, spec_for, unregister

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


@pytest.fixture
def toy_kind():
    register(TOY)
    yield TOY
    unregister(TOY.kind)


def test_every_kind_has_one_spec_and_its_vllm_method():
    assert {kind: spec.vllm_method for kind, spec in DRAFTERS.items()} == {
        "model": "draft_model", "eagle3": "eagle3", "block": "dflash", "suffix": "ngram", "eagle": None,
        "medusa": None, "layer_skip": None, "recurrent": None}
    assert spec_for("dflash") is DRAFTERS["block"]
    assert [k for k, s in DRAFTERS.items() if s.model_free] == ["suffix"]
    assert {k for k, s in DRAFTERS.items() if s.trainable} == {"model", "eagle", "eagle3", "medusa", "block",
                                                                "recurrent"}
    assert EngineConfig(drafters=("dflash",)).drafters == ("block",)


def test_an_unregistered_kind_is_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match=r"drafters=\('toy',\) is invalid: .*'block'"):
        EngineConfig(drafters=("toy",))
    with pytest.raises(ValueError, match="drafter kind 'toy' is unknown"):
        spec_for("toy")


def test_a_registered_kind_drafts_exactly_learns_and_round_trips(toy_kind, tmp_path):
    target = tiny_lm("llama", "sdpa")
    vocab_size = target.config.vocab_size
    config = EngineConfig(max_batch_size=4, max_seq_len=40, gamma=3, drafters=("toy", "suffix"), record_signals=True)
    head = BigramHead(vocab_size, seed=1)
    engine = SpecEngine(target, head, config)
    plain = SpecEngine(target, None, EngineConfig(max_batch_size=4, max_seq_len=40, gamma=0))
    prompts = make_prompts(6, 2, 6)
    expected = [r.completion_ids for r in plain.generate(prompts, GREEDY)]
    assert [r.completion_ids for r in engine.generate(prompts, GREEDY)] == expected
    assert engine.stats.by_drafter["toy"].proposals > 0

    learner = make_online_learner(head, target, LearnerConfig(lr=1e-2, max_steps=20, batch_size=4, warmup_steps=0,
                                                              ema_decay=0.0, gate_z=0.0, holdout_fraction=0.34))
    learner.set_draft_vocab(DraftVocab(torch.arange(0, vocab_size, 2), vocab_size))
    for seed in range(3):
        learner.add_rollouts(engine.generate(make_prompts(6, 2, 6, seed=seed),
                                             SamplingParams(max_new_tokens=12, temperature=1.0, seed=seed), n=2))
    assert learner.train_round().published
    version = learner.published_version()
    engine.load_drafter(version)
    assert engine.drafter_version == version.number >= 1
    assert torch.equal(engine.draft_vocab(), version.draft_vocab)
    assert [r.completion_ids for r in engine.generate(prompts, GREEDY)] == expected

    trained = BigramHead(vocab_size)
    trained.load_state_dict(version.weights)
    save_head_file(tmp_path / "toy.pt", trained, version.draft_vocab)
    served = EngineConfig(max_batch_size=4, max_seq_len=40, gamma=3, drafters=("toy",),
                          draft_vocab=int(version.draft_vocab.numel()))  # starts from the file's vocabulary
    paths = ModelPaths("the target is given", head=str(tmp_path / "toy.pt"))
    assert trained_drafter_kind(paths, served) == "toy"
    loaded = load_drafter(paths, served, target)
    again = SpecEngine(target, loaded, served)
    assert again.served_drafter_digest(loaded) == version.digest(served.dtype)
    assert [r.completion_ids for r in again.generate(prompts, GREEDY)] == expected
