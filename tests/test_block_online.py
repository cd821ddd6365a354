"""The block drafter's online learner: anchors where the engine anchors, drafts scored where the engine drafts.

`BlockScorer` samples anchors at the last prompt token and completion positions (never in the prompt, never at
the last token), trains each draft against the recorded p of the token it drafts, touches no policy weight,
restricts q to a draft vocabulary when one is set, and scores each position as the mean over the depths at which
blocks draft it. A block head trained with a draft vocabulary publishes it, and the engine serves it exactly.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_prompts, tiny_lm

from specroll.integrations.model_source import ModelPaths, load_drafter
from specroll.integrations.yaml_config import load_config
from specroll.online_drafter import LearnerConfig, make_online_learner
from specroll.online_drafter.divergence import LOSSES, expected_acceptance
from specroll.online_drafter.heads.block_scorer import BlockScorer, _anchorable
from specroll.online_drafter.heads.data import collate, from_rollout
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.draft_vocab import DraftVocab
from specroll.rollout.drafters.heads.block import BlockHead


def rollouts(target, n: int = 8):
    config = EngineConfig(max_batch_size=8, max_seq_len=40, gamma=3, drafters=("block",), block_size=4,
                          record_signals=True)
    return SpecEngine(target, None, config).generate(make_prompts(n, 3, 7, seed=1),
                                                     SamplingParams(max_new_tokens=16, temperature=1.0, seed=0))


def scorer(target, anchors: int = 4) -> BlockScorer:
    return BlockScorer(target.get_input_embeddings(), target.get_output_embeddings(), 1.0, 4, 1.0,
                       torch.device("cpu"), anchors)


def test_anchors_are_the_last_prompt_token_and_completion_positions():
    target = tiny_lm("llama", "sdpa", layers=4)
    sequences = [from_rollout(r) for r in rollouts(target, 4)]
    batch = collate(sequences)
    valid = _anchorable(batch)
    for b, s in enumerate(sequences):
        length = s.token_ids.shape[0]
        expected = torch.zeros(batch.token_ids.shape[1], dtype=torch.bool)
        expected[s.prompt_len - 1 : length - 1] = True
        assert torch.equal(valid[b], expected)


def test_the_loss_trains_the_head_only_and_each_draft_against_its_tokens_p():
    target = tiny_lm("llama", "sdpa", layers=4)
    batch = collate([from_rollout(r) for r in rollouts(target, 4)])
    head = BlockHead.for_target(target.config, block_size=4, seed=1)
    loss = scorer(target).loss(head, batch, LOSSES["kl"])
    loss.backward()
    assert torch.isfinite(loss) and head.fc.weight.grad is not None and head.mask_embedding.grad is not None
    assert target.get_output_embeddings().weight.grad is None and target.get_input_embeddings().weight.grad is None


def test_acceptance_is_the_mean_over_the_depths_that_draft_a_position():
    target = tiny_lm("llama", "sdpa", layers=4)
    sequence = from_rollout(rollouts(target, 1)[0])
    batch = collate([sequence])
    head = BlockHead.for_target(target.config, block_size=4, seed=1)
    score = scorer(target)
    with torch.no_grad():
        acceptance = score.acceptance(head, batch)[0]  # [L]
        prompt = sequence.prompt_len

        def accepted(anchor: int, depth: int) -> float:
            log_q = score.block_log_q(head, batch, torch.tensor([[anchor]]))[:, depth : depth + 1]  # [1, 1, V]
            at = anchor + 1 + depth
            return float(expected_acceptance(log_q, batch.topk_ids[:, at : at + 1], batch.topk_probs[:, at : at + 1]))

        # The first completion token is drafted only as draft 1 of the block at the last prompt token; the third by
        # three blocks (anchored at P − 1, P, P + 1).
        assert acceptance[prompt].item() == pytest.approx(accepted(prompt - 1, 0), abs=1e-6)
        third = [accepted(prompt + 1 - d, d) for d in range(3)]
        assert acceptance[prompt + 2].item() == pytest.approx(sum(third) / 3, abs=1e-6)
        assert float(acceptance[:prompt].abs().sum()) == 0.0


def test_a_draft_vocabulary_is_trained_published_and_served_exactly():
    target = tiny_lm("llama", "sdpa", layers=4)
    head = BlockHead.for_target(target.config, block_size=4, seed=0)
    learner = make_online_learner(head, target, LearnerConfig(lr=3e-3, max_steps=20, batch_size=8, warmup_steps=0,
                                                              gate_z=0.0))
    ids = torch.arange(0, 64, 2)
    learner.set_draft_vocab(DraftVocab(ids, 64))
    learner.add_rollouts(rollouts(target, 24))
    assert learner.train_round().published
    version = learner.published_version()
    assert version.draft_vocab is not None
    config = EngineConfig(max_batch_size=4, max_seq_len=40, gamma=3, drafters=("block",), block_size=4)
    engine = SpecEngine(target, BlockHead.for_target(target.config, block_size=4, seed=5), config)
    engine.load_drafter(version)
    assert torch.equal(engine.draft_vocab(), version.draft_vocab)
    prompts, greedy = make_prompts(8, 1, 9, seed=2), SamplingParams(max_new_tokens=16, temperature=0)
    plain = SpecEngine(target, None, EngineConfig(max_batch_size=4, max_seq_len=40, gamma=0)).generate(prompts, greedy)
    assert [r.completion_ids for r in engine.generate(prompts, greedy)] == [r.completion_ids for r in plain]


def test_models_head_state_dict_and_yaml_select_the_block_drafter(tmp_path):
    target = tiny_lm("llama", "sdpa", layers=4)
    head = BlockHead.for_target(target.config, block_size=5, seed=3)
    torch.save(head.state_dict(), tmp_path / "block.pt")
    path = tmp_path / "engine.yaml"
    path.write_text("drafters: [dflash]\nblock_size: 5\nblock_layers: [1]\ngamma: auto\n")
    config = load_config(path, EngineConfig)
    assert config.drafters == ("block",) and config.block_size == 5 and config.max_gamma == 4
    loaded = load_drafter(ModelPaths(target="unused", head=str(tmp_path / "block.pt")), config, target)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), head.state_dict().values()))
    assert SpecEngine(target, loaded, config).drafter.head.block_size == 5
