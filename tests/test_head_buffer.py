"""The one replay buffer holds a head's feature sequences as it holds a drafter LM's rollouts: the oldest
policy version is evicted first, and positions whose draft was rejected weigh `rejected_weight`.

Both pin what changed when the head learner's own buffer (insertion-order eviction, rejections ignored)
gave way to the shared one."""

from __future__ import annotations

import torch

from specroll.online_drafter import BufferConfig, FeatureBuffer, FeatureSequence
from specroll.online_drafter.heads.data import from_rollout
from specroll.rollout import Rollout, RolloutSignals

H = 4  # hidden width


def sequence(version: int, num_pos: int = 4, rejected_at: tuple[int, ...] | None = (), first_token: int = 0,
             prompt_len: int = 2) -> FeatureSequence:
    length = prompt_len + num_pos
    rejected = None
    if rejected_at is not None:
        rejected = torch.zeros(num_pos, dtype=torch.bool)
        rejected[list(rejected_at)] = True
    return FeatureSequence(token_ids=torch.arange(first_token, first_token + length), prompt_len=prompt_len,
                           hidden=torch.ones(length - 1, H, dtype=torch.float16),
                           topk_ids=torch.zeros(num_pos, 3, dtype=torch.long), topk_probs=torch.full((num_pos, 3), 0.2),
                           policy_version=version, rejected=rejected)


def test_head_sequences_are_evicted_oldest_version_first():
    """A held-out group of version 0 handed back to training after version 1's sequences (`HoldoutSet.trim`)
    goes first when the buffer is full, though it came last (the head's old buffer evicted by arrival)."""
    buffer = FeatureBuffer(BufferConfig(max_positions=12))
    buffer.add([sequence(1, first_token=10), sequence(1, first_token=20)])
    buffer.add([sequence(0, first_token=0)])  # a held-out group of an older version, returned to training
    buffer.add([sequence(2, first_token=30)])
    assert buffer.num_positions == 12
    assert buffer.versions == [1, 2]
    assert [int(s.token_ids[0]) for s in buffer.entries()] == [10, 20, 30]


def test_rejected_positions_of_head_sequences_weigh_more():
    """`rejected_weight` 3 at the one rejected position of four: weights [1, 3, 1, 1] / 6 at the completion
    positions (a head's batch indexes sequence positions: the prompt's two come first, weight 0)."""
    buffer = FeatureBuffer(BufferConfig(rejected_weight=3.0))
    buffer.add([sequence(0, rejected_at=(1,))])
    batch = buffer.sample(2, torch.Generator().manual_seed(0))
    assert torch.allclose(batch.weights[0], torch.tensor([0.0, 0.0, 1.0, 3.0, 1.0, 1.0]) / 6)
    assert torch.allclose(batch.weights.sum(1), torch.ones(2))


def test_offline_sequences_weigh_every_position_alike():
    """A sequence never drafted (`from_target`: `rejected` None) weighs its positions equally, whatever
    `rejected_weight`."""
    buffer = FeatureBuffer(BufferConfig(rejected_weight=3.0))
    buffer.add([sequence(0, rejected_at=None)])
    assert torch.allclose(buffer.sample(1).weights[0], torch.tensor([0.0, 0.0, 0.25, 0.25, 0.25, 0.25]))


def test_a_head_rollout_records_its_rejected_drafts():
    """Drafted and rejected (draft id ≥ 0, not accepted) is rejected; not drafted (−1) or accepted is not."""
    signals = RolloutSignals(torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 2), torch.tensor([5, -1, 7]),
                             torch.tensor([False, False, True]), hidden=torch.zeros(4, H, dtype=torch.float16))
    rollout = Rollout(prompt_ids=[1, 2], completion_ids=[3, 4, 5], logprobs=[0.0] * 3, finish_reason="length",
                      signals=signals)
    assert from_rollout(rollout).rejected.tolist() == [True, False, False]
