"""DraftBuffer: bounded by positions, oldest version evicted first, recency- and rejection-weighted
sampling, and a save/load round trip."""

from __future__ import annotations

import pytest
import torch

from specroll.online_drafter import BufferConfig, BufferedRollout, DraftBuffer
from specroll.online_drafter.lm.data import to_buffered
from specroll.rollout import Rollout, RolloutSignals


def entry(version: int, num_pos: int = 4, rejected_at: tuple[int, ...] = (), first_token: int = 0) -> BufferedRollout:
    rejected = torch.zeros(num_pos, dtype=torch.bool)
    rejected[list(rejected_at)] = True
    return BufferedRollout(
        token_ids=torch.arange(first_token, first_token + 2 + num_pos), prompt_len=2,
        topk_ids=torch.zeros(num_pos, 3, dtype=torch.long), topk_probs=torch.full((num_pos, 3), 0.2),
        rejected=rejected, policy_version=version,
    )


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="recency_decay"):
        BufferConfig(recency_decay=0.0)
    with pytest.raises(ValueError, match="max_positions"):
        BufferConfig(max_positions=0)


def test_the_learner_config_carries_the_buffer_section(tmp_path):
    import torch.nn as nn

    from specroll.online_drafter import DraftLearner, LearnerConfig

    config = LearnerConfig(buffer={"recency_decay": 0.3, "rejected_weight": 4.0})  # as a YAML section reads
    assert config.buffer == BufferConfig(recency_decay=0.3, rejected_weight=4.0)
    with pytest.raises(ValueError, match="rejected_weight"):
        LearnerConfig(buffer={"rejected_weight": 0.5})

    class Linear(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(2, 2)

    learner = DraftLearner(Linear(), config)
    assert learner.buffer.config.recency_decay == 0.3
    learner.save(tmp_path / "learner.pt")
    assert DraftLearner.load(tmp_path / "learner.pt", Linear()).config.buffer == config.buffer


def test_bounded_by_positions_and_evicts_oldest_version_first():
    buffer = DraftBuffer(BufferConfig(max_positions=12))
    buffer.add([entry(1, first_token=10), entry(0, first_token=0), entry(1, first_token=20)])
    buffer.add([entry(2, first_token=30)])
    assert buffer.num_positions == 12
    assert buffer.versions == [1, 2]
    assert [int(e.token_ids[0]) for e in buffer.entries()] == [10, 20, 30]


def test_sampling_favours_newer_versions_by_recency_decay():
    """4000 draws between two equal rollouts of versions 0 and 1, decay 0.25: P(old) = 0.2, ±0.04 is > 6σ."""
    buffer = DraftBuffer(BufferConfig(recency_decay=0.25))
    buffer.add([entry(0, first_token=0), entry(1, first_token=50)])
    batch = buffer.sample(4000, torch.Generator().manual_seed(0))
    old_share = float((batch.input_ids[:, 0] == 0).float().mean())
    assert abs(old_share - 0.2) < 0.04


def test_batches_group_rollouts_by_length_and_draw_them_as_sample_does():
    """8 rollouts of 1..8 positions, drawn ∝ their total weight (n / 36) as `sample` draws them: 1600
    draws into 400 batches of 4. Each batch spans ~1 length (random batches of 4: ~4); each rollout's
    share is n / 36 ± 0.04 (≥ 3.8σ at n = 1600); the batches come in random order, not by length."""
    buffer = DraftBuffer(BufferConfig(rejected_weight=1.0))
    buffer.add([entry(0, num_pos=n, first_token=10 * n) for n in range(1, 9)])
    batches = buffer.sample_batches(400, 4, torch.Generator().manual_seed(0))
    assert len(batches) == 400 and all(b.input_ids.shape[0] == 4 for b in batches)
    lengths = [sorted((b.weights > 0).sum(1).tolist()) for b in batches]
    assert sum(ls[-1] - ls[0] for ls in lengths) / len(lengths) <= 1.0
    firsts = torch.cat([b.input_ids[:, 0] for b in batches])
    shares = torch.stack([(firsts == 10 * n).float().mean() for n in range(1, 9)])
    assert torch.all((shares - torch.arange(1, 9) / 36).abs() < 0.04), shares
    assert lengths != sorted(lengths)
    assert torch.allclose(torch.cat([b.weights.sum(1) for b in batches]), torch.ones(1600))


def test_rejected_positions_weigh_more_and_weights_sum_to_one_per_rollout():
    buffer = DraftBuffer(BufferConfig(rejected_weight=3.0))
    buffer.add([entry(0, rejected_at=(1,))])
    batch = buffer.sample(2, torch.Generator().manual_seed(0))
    assert torch.allclose(batch.weights[0], torch.tensor([1.0, 3.0, 1.0, 1.0]) / 6)
    assert torch.allclose(batch.weights.sum(1), torch.ones(2))
    assert batch.loss_index[0].tolist() == [1, 2, 3, 4]  # logits at P-1+t predict completion token t


def test_save_load_round_trip(tmp_path):
    buffer = DraftBuffer(BufferConfig(max_positions=100, recency_decay=0.7))
    buffer.add([entry(0, rejected_at=(0,)), entry(3, num_pos=6)])
    buffer.save(tmp_path / "buffer.pt")
    loaded = DraftBuffer.load(tmp_path / "buffer.pt")
    assert loaded.config == buffer.config
    assert loaded.num_positions == buffer.num_positions
    for a, b in zip(loaded.entries(), buffer.entries(), strict=True):
        assert a.policy_version == b.policy_version and a.prompt_len == b.prompt_len
        for name in ("token_ids", "topk_ids", "topk_probs", "rejected"):
            assert torch.equal(getattr(a, name), getattr(b, name))


def test_rollout_without_signals_is_refused():
    rollout = Rollout(prompt_ids=[1, 2], completion_ids=[3], logprobs=[0.0], finish_reason="length")
    with pytest.raises(ValueError, match="record_signals"):
        to_buffered(rollout)
    rollout.signals = RolloutSignals(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2),
                                     torch.tensor([3]), torch.tensor([False]))
    assert bool(to_buffered(rollout).rejected[0])
