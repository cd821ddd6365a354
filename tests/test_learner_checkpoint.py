"""Learner and buffer checkpoints: a crash mid-save keeps the previous file; a bad file is a ValueError by path."""

from __future__ import annotations

import copy

import pytest
import torch
from online_fixtures import tiny_llama

from specroll.online_drafter import DraftBuffer, DraftLearner, LearnerConfig
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

V = 32


@pytest.fixture(scope="module")
def learner() -> DraftLearner:
    target, drafter = tiny_llama(32, 2, seed=0), tiny_llama(16, 1, seed=1)
    engine = SpecEngine(target, copy.deepcopy(drafter), EngineConfig(max_batch_size=10, max_seq_len=32, gamma=2,
                                                                     record_signals=True, signal_top_k=8))
    rollouts = engine.generate([[i % V, (3 * i) % V] for i in range(10)],
                               SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))
    learner = DraftLearner(drafter, LearnerConfig(lr=1e-2, max_steps=3, batch_size=4, seed=0))
    learner.add_rollouts(rollouts)
    return learner


def crash_mid_write(obj, f, *args, **kwargs):
    """Stands in for `torch.save` when the process dies half-way: some bytes land, then it fails."""
    if hasattr(f, "write"):
        f.write(b"PK\x03\x04 half a checkpoint")
    else:
        with open(f, "wb") as out:
            out.write(b"PK\x03\x04 half a checkpoint")
    raise RuntimeError("killed mid-write")


def test_a_crash_mid_save_keeps_the_previous_checkpoint(learner, tmp_path, monkeypatch):
    path = tmp_path / "learner.pt"
    learner.save(path)
    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", crash_mid_write)
        with pytest.raises(RuntimeError, match="killed mid-write"):
            learner.save(path)
    resumed = DraftLearner.load(path, tiny_llama(16, 1, seed=7))
    assert resumed.version == learner.version
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learner.pt"]  # no temporary file left behind


@pytest.mark.parametrize("damage", ["empty", "truncated", "not_a_checkpoint", "missing_keys"])
def test_a_bad_checkpoint_is_a_value_error_naming_the_path(learner, tmp_path, damage):
    path = tmp_path / "learner.pt"
    learner.save(path)
    whole = path.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(whole[: len(whole) // 2])
    elif damage == "not_a_checkpoint":
        path.write_text("grpo: {steps: 2}\n")
    else:
        torch.save({"version": 3}, path)
    published = {name: t.clone() for name, t in learner.published_version().weights.items()}
    drafter = tiny_llama(16, 1, seed=7)
    weights = {name: p.clone() for name, p in drafter.named_parameters()}
    with pytest.raises(ValueError, match=rf"^checkpoint {path}"):
        DraftLearner.load(path, drafter)
    for name, tensor in learner.published_version().weights.items():  # the served drafter is untouched
        assert torch.equal(tensor, published[name])
    for name, param in drafter.named_parameters():
        assert torch.equal(param, weights[name])


def test_a_checkpoint_of_another_architecture_is_a_value_error(learner, tmp_path):
    path = tmp_path / "learner.pt"
    learner.save(path)
    with pytest.raises(ValueError, match=rf"^checkpoint {path}.*shape"):
        DraftLearner.load(path, tiny_llama(8, 1, seed=7))


def test_buffer_checkpoints_are_atomic_and_checked(learner, tmp_path, monkeypatch):
    path = tmp_path / "buffer.pt"
    learner.buffer.save(path)
    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", crash_mid_write)
        with pytest.raises(RuntimeError, match="killed mid-write"):
            learner.buffer.save(path)
    assert DraftBuffer.load(path).num_positions == learner.buffer.num_positions
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"^checkpoint {path} is empty"):
        DraftBuffer.load(path)
