"""The calibration behind `gamma: auto` (`models.timing`): every grid point measured, whatever the budget.

The forwards run for real; the clock is a fake one that each target forward moves by a modelled cost, so what the
calibration read can be compared with what the hardware "took", exactly.
"""

from __future__ import annotations

import pytest
from tiny_models import tiny_lm

from specroll.rollout import EngineConfig, SpecEngine
from specroll.rollout.models import timing
from specroll.rollout.models.runner import ModelRunner


def modelled_forward(batch: int, query_len: int) -> float:
    """A forward's seconds, shaped as a CPU's: steep in the rows up to 4, shallow past them."""
    return 0.01 + 0.01 * min(batch, 4) * query_len + 0.001 * batch * query_len


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def slow_target(monkeypatch):
    """A target whose every forward advances the fake clock by `modelled_forward` (and a burst of other work on
    the machine that lands on the first timed run of 16 rows at one query, +50%); the drafter's forwards are free."""
    clock = FakeClock()
    target = tiny_lm("llama", layers=2)
    real_forward = ModelRunner.forward
    runs: dict[tuple[int, int], int] = {}

    def forward(self, rows, input_ids, *args, **kwargs):
        out = real_forward(self, rows, input_ids, *args, **kwargs)
        if self.model is not target and self.model.config is not target.config:
            return out
        key = (input_ids.shape[0], input_ids.shape[1])
        runs[key] = runs.get(key, 0) + 1
        burst = 1.5 if key == (16, 3) and runs[key] == 1 else 1.0  # (16, 3) has no warm-up: its first timed run
        clock.now += modelled_forward(*key) * burst
        return out

    monkeypatch.setattr(ModelRunner, "forward", forward)
    monkeypatch.setattr("specroll.rollout.models.timing.time", clock)
    monkeypatch.setattr("specroll.rollout.gamma.calibration.time", clock)
    return target, runs


def test_every_batch_size_is_measured_even_when_the_budget_runs_out_first(slow_target, tmp_path):
    target, runs = slow_target
    config = EngineConfig(max_batch_size=16, max_seq_len=128, gamma="auto", max_gamma=4, cost_model_budget_s=0.05,
                          calibration_cache=str(tmp_path))
    engine = SpecEngine(target, tiny_lm("llama", layers=1), config)
    table = engine.gamma_policy.cost.target
    assert table.batch_sizes[-1] == 16
    grid = [(b, q) for b in table.batch_sizes for q in table.query_lens]
    # Measured, not extrapolated from the small batches (that read 16 rows at 2-3x their time), and the burst on
    # one run of (16, 3) is gone: the point keeps its fastest run.
    assert [round(table(b, q), 9) for b, q in grid] == [round(modelled_forward(b, q), 9) for b, q in grid]
    assert min(runs[point] for point in grid) >= timing.MIN_ROUNDS  # not a single run: one reads up to ~20% high


def test_one_high_point_is_pooled_with_its_neighbours_not_copied_onto_longer_queries():
    times = [[0.20, 0.10, 0.12, 0.14, 0.16],
             [0.30, 0.31, 0.32, 0.33, 0.34]]
    out = timing._monotone([list(row) for row in times])
    assert out[0] == pytest.approx([0.14, 0.14, 0.14, 0.14, 0.16])  # a running maximum read 0.20 up to Q = 4
    assert out[1] == pytest.approx(times[1])
    for row in out:
        assert row == sorted(row)
    for col in zip(*out):
        assert list(col) == sorted(col)


def test_monotone_across_batch_sizes_after_pooling_along_the_queries():
    out = timing._monotone([[0.10, 0.30], [0.25, 0.20], [0.40, 0.50]])
    for row in out:
        assert row == sorted(row)
    for col in zip(*out):
        assert list(col) == sorted(col)


def test_a_drafts_first_call_is_timed_right_after_a_target_forward(monkeypatch, tmp_path):
    """A step's first draft runs after the target's forward has taken the caches (measured: 1.5-1.7x its time in a
    tight loop), so the calibration times the drafter's catch-up column (query 2) right after a target forward of
    the same rows, untimed, and its further drafts (query 1) back to back, as a step runs them."""
    target, drafter = tiny_lm("llama", layers=2), tiny_lm("llama", layers=1)
    real_forward = ModelRunner.forward
    calls: list[tuple[str, int, int]] = []

    def forward(self, rows, input_ids, *args, **kwargs):
        calls.append(("target" if self.model is target else "drafter", *input_ids.shape))
        return real_forward(self, rows, input_ids, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "forward", forward)
    SpecEngine(target, drafter, EngineConfig(max_batch_size=4, max_seq_len=128, gamma="auto", max_gamma=2,
                                             cost_model_budget_s=0.2, calibration_cache=str(tmp_path)))
    first_draft = [i for i, call in enumerate(calls) if call[0] == "drafter" and call[2] == 2]
    further = [i for i, call in enumerate(calls) if call[0] == "drafter" and call[2] == 1]
    assert first_draft and further
    assert all(calls[i - 1] == ("target", calls[i][1], 1) for i in first_draft)
    assert not any(calls[i - 1][0] == "target" for i in further if i)
