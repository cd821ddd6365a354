"""The cost model prices the sampling of every verified position past the first (logits processed, and under the
invariant sampler a Gumbel hash per position), so a speculative step is priced right before one has run."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_lm

from specroll.rollout import EngineConfig, SpecEngine
from specroll.rollout.gamma.auto import AutoGamma
from specroll.rollout.gamma.cost_model import CostModel
from specroll.rollout.gamma.policy import StepShape
from specroll.rollout.models.timing import ForwardTimes, SamplingTimes

SAMPLING = SamplingTimes([1, 16], greedy_token=[1e-3, 4e-3], sampled_token=[2e-3, 8e-3], noise=[5e-3, 20e-3])


def flat_cost(sampling: SamplingTimes | None, invariant: bool = True) -> CostModel:
    """Forwards of 0.1 s whatever the shape, drafts of 1 ms."""
    target = ForwardTimes([1, 16], [1, 2, 3, 5, 9], [[0.1] * 5] * 2)
    drafter = ForwardTimes([1, 16], [1, 2], [[1e-3, 1e-3]] * 2)
    return CostModel(target=target, drafter=drafter, sampling=sampling, invariant=invariant)


def added_by_verification(cost: CostModel, batch: int, gamma: int) -> float:
    return cost.step_time(batch, gamma) - cost.step_time(batch, 0) - cost.draft_time(batch, gamma)


@pytest.mark.parametrize(("invariant", "greedy", "per_position", "plain"), [
    (True, False, 8e-3 + 20e-3, 8e-3 + 20e-3),  # softmax and the position's noise
    (True, True, 4e-3, 4e-3),  # greedy: a one-hot, no noise
    (False, False, 8e-3, 8e-3 + 20e-3),  # rejection sampling: one draw per step (the bonus or the residual)
])
def test_each_verified_position_is_priced(invariant, greedy, per_position, plain):
    cost = flat_cost(SAMPLING, invariant)
    cost.greedy = greedy
    assert cost.step_time(16, 0) == pytest.approx(0.1 + plain)  # a plain step samples its one position
    assert added_by_verification(cost, 16, 3) == pytest.approx(3 * per_position)
    assert added_by_verification(cost, 16, 0) == 0
    mid = flat_cost(SAMPLING, invariant)
    mid.greedy = greedy
    assert 0 < added_by_verification(mid, 8, 3) < 3 * per_position  # interpolated between 1 and 16 rows
    assert added_by_verification(flat_cost(None, invariant), 16, 3) == pytest.approx(0, abs=1e-12)


def test_a_tree_pays_noise_per_level_and_processing_per_node():
    cost = flat_cost(SAMPLING)
    extra = cost.verify_time(16, 1 + 3 * 2, positions=4) - cost.verify_time(16, 4)  # 3 more nodes, same 4 positions
    assert extra == pytest.approx(3 * 8e-3)


def test_break_even_counts_the_sampling_and_follows_the_mode():
    without = AutoGamma(flat_cost(None), max_gamma=4, decay=0.9)
    with_sampling = AutoGamma(flat_cost(SAMPLING), max_gamma=4, decay=0.9)
    assert with_sampling.break_even_acceptance(16, 64) > without.break_even_acceptance(16, 64)
    sampled = with_sampling.step_times(16, 64)
    with_sampling.choose(StepShape(16), greedy=True)  # the mode of the steps it chooses for
    assert with_sampling.cost.greedy
    assert with_sampling.step_times(16, 64)[3] == pytest.approx(sampled[3] - 4 * (8e-3 + 20e-3 - 4e-3))


@pytest.mark.parametrize("sampler", ["invariant", "rejection"])
def test_an_auto_engine_measures_the_sampling_of_its_vocabulary(tmp_path, sampler):
    engine = SpecEngine(tiny_lm("llama"), tiny_lm("llama", layers=1), EngineConfig(
        max_batch_size=4, max_seq_len=64, gamma="auto", max_gamma=3, sampler=sampler,
        calibration_cache=str(tmp_path), cost_model_budget_s=1.0))
    cost = engine.gamma_policy.cost
    assert cost.invariant == (sampler == "invariant")
    times = cost.sampling
    assert times.batch_sizes == cost.target.batch_sizes
    for values in (times.greedy_token, times.sampled_token, times.noise):
        assert all(t > 0 for t in values) and values == sorted(values)  # more rows never cost less
    assert cost.sampling_time(4, 4) > 0


def test_calibrating_leaves_the_callers_random_stream_alone(tmp_path):
    """A seeded training script gets the same random numbers whether the engine measured its costs or found them
    cached: the calibration draws from generators of its own."""
    target, drafter = tiny_lm("llama"), tiny_lm("llama", layers=1)
    state = torch.get_rng_state()
    SpecEngine(target, drafter, EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto", max_gamma=3,
                                             calibration_cache=str(tmp_path), cost_model_budget_s=1.0))
    assert torch.equal(torch.get_rng_state(), state)
