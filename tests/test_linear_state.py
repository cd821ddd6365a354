"""Recurrent-layer state in the ragged cache: padding, rollback, and its limit.

Tiny random fp32 models from `arch_sweep.tiny_model` (slow decays, so the state matters): Qwen3-Next
(one Gated DeltaNet and one attention layer) and, for the per-row rollback, Mamba and Falcon-H1
(attention and Mamba-2 side by side in each layer) too. The reference is HF's own forward over each
row's whole sequence, without a cache.
"""

from __future__ import annotations

import copy

import pytest
import torch

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.models.cache import STATE_HISTORY
from specroll.rollout.models.runner import ModelRunner
from specroll.tools.arch_sweep import hf_greedy, prompts, tiny_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def hybrid():
    return tiny_model("qwen3_next")


@torch.inference_mode()
def hf_next_logits(model, sequence: list[int]) -> torch.Tensor:
    """[V] HF's logits after `sequence`, no cache."""
    return model(input_ids=torch.tensor([sequence])).logits[0, -1]


@pytest.mark.parametrize("model_type", ["qwen3_next", "mamba", "falcon_h1"])
def test_rollback_keeps_each_rows_state_at_its_own_length(model_type):
    # A ragged prefill (right padding, the longest row past the state rings so padding could wrap
    # onto the short rows' states), then 4 fed tokens of which each row keeps another prefix (0..3),
    # then one more token: each row's logits are HF's on exactly the tokens it kept.
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 64, (n,), generator=gen).tolist() for n in (1, 5, 9, STATE_HISTORY + 6)]
    fed = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14], [15, 16, 17, 18]])
    kept = torch.tensor([0, 1, 2, 3])
    length = STATE_HISTORY + 12
    model = tiny_model(model_type)
    runner = ModelRunner(model, batch=4, length=length, dtype=torch.float32, device=CPU)
    tokens = torch.zeros(4, length, dtype=torch.long)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = torch.tensor(row)
    count = torch.tensor([len(row) for row in rows])
    runner.extend(slice(0, 4), tokens, count)
    runner.feed(slice(0, 4), fed)
    runner.rollback(slice(0, 4), count + kept)
    nxt = torch.tensor([[20], [21], [22], [23]])
    logits = runner.feed(slice(0, 4), nxt)[:, 0]  # [4, V]
    for b, row in enumerate(rows):
        sequence = row + fed[b, : kept[b]].tolist() + nxt[b].tolist()
        torch.testing.assert_close(logits[b], hf_next_logits(model, sequence), atol=1e-4, rtol=1e-4)


def noisy_copy(model, noise: float = 0.5):
    """`model` with Gaussian noise (`noise` × the weights' std) on its LM head: a partly agreeing drafter."""
    drafter = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        w = drafter.lm_head.weight
        w.add_(noise * w.std() * torch.randn(w.shape, generator=gen))
    return drafter


def test_noisy_drafter_rows_accept_different_lengths_and_match_hf(hybrid):
    drafter = noisy_copy(hybrid)
    rows = prompts()
    engine = SpecEngine(hybrid, drafter, EngineConfig(max_batch_size=4, max_seq_len=32, gamma=3))
    dropped = []  # per verification step, the tokens each row's rollback drops
    rollback = engine.target.rollback

    def spy(rows_, lens, host_lens=None):
        dropped.append((engine.target.cache.lens[rows_] - lens).tolist())
        rollback(rows_, lens, host_lens)

    engine.target.rollback = spy
    out = engine.generate(rows, SamplingParams(max_new_tokens=12, temperature=0))
    assert [r.completion_ids for r in out] == hf_greedy(hybrid, rows, new_tokens=12)
    assert any(len(set(step)) > 1 for step in dropped), dropped  # rows rolled back by different amounts


def test_refilled_slots_start_from_a_fresh_state(hybrid):
    # 8 prompts through 3 slots: finished rows' slots are reset for new requests and a live row is
    # moved to keep the batch packed (rows finish apart: the noisy drafter's acceptance varies).
    gen = torch.Generator().manual_seed(3)
    rows = [torch.randint(3, 64, (n,), generator=gen).tolist() for n in (1, 7, 3, 12, 5, 9, 2, 6)]
    engine = SpecEngine(hybrid, noisy_copy(hybrid), EngineConfig(max_batch_size=3, max_seq_len=24, gamma=3))
    moves = []
    move_row = engine.target.cache.move_row

    def spy(src: int, dst: int) -> None:
        moves.append((src, dst))
        move_row(src, dst)

    engine.target.cache.move_row = spy
    out = engine.generate(rows, SamplingParams(max_new_tokens=8, temperature=0))
    assert [r.completion_ids for r in out] == hf_greedy(hybrid, rows, new_tokens=8)
    assert moves


def test_rollback_past_the_state_history_raises(hybrid):
    runner = ModelRunner(hybrid, batch=1, length=STATE_HISTORY + 8, dtype=torch.float32, device=CPU)
    runner.feed(slice(0, 1), torch.full((1, STATE_HISTORY + 2), 5))
    runner.rollback(slice(0, 1), torch.tensor([1]))  # the state after 1 token is no longer held
    with pytest.raises(RuntimeError, match="rolled back more than"):
        runner.feed(slice(0, 1), torch.tensor([[6]]))


def test_rollback_to_zero_is_a_fresh_row(hybrid):
    runner = ModelRunner(hybrid, batch=1, length=STATE_HISTORY + 8, dtype=torch.float32, device=CPU)
    runner.feed(slice(0, 1), torch.full((1, STATE_HISTORY + 2), 5))
    runner.rollback(slice(0, 1), torch.tensor([0]))
    logits = runner.feed(slice(0, 1), torch.tensor([[6, 7]]))[0, -1]
    torch.testing.assert_close(logits, hf_next_logits(hybrid, [6, 7]), atol=1e-4, rtol=1e-4)


def test_outside_the_engine_the_model_runs_hf_forward(hybrid):
    # The ragged forward is installed on the model's Gated DeltaNet modules; HF's generate still works.
    ModelRunner(hybrid, batch=1, length=8, dtype=torch.float32, device=CPU)
    ids = torch.tensor([prompts()[2]])
    cached = hybrid.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    assert hf_next_logits(hybrid, cached[0, :-1].tolist()).argmax() == cached[0, -1]


def test_state_history_follows_max_gamma(hybrid):
    """A recurrent target's state rings hold max_gamma + 1 lengths, for any max_gamma (not a fixed 16)."""
    for max_gamma in (2, 20):
        engine = SpecEngine(hybrid, copy.deepcopy(hybrid), EngineConfig(max_batch_size=2, max_seq_len=32,
                                                                        gamma=max_gamma, max_gamma=max_gamma))
        assert engine.target.cache.history == max_gamma + 1
        assert engine.drafter.runner.cache.history == max_gamma + 1
