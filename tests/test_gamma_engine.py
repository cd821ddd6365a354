"""Auto γ inside the engine: greedy exactness when γ changes from step to step, the calibration
cache, and what the engine feeds the policy (step times, drafting times, the KV length)."""

from __future__ import annotations

from conftest import make_prompts, noisy_copy, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.cost_model import calibrate


def test_calibration_is_cached_per_model_shape(tmp_path):
    engine = SpecEngine(tiny_lm("llama"), tiny_lm("llama", layers=1), EngineConfig(max_batch_size=4, max_seq_len=64))
    target, drafter = engine.target, engine.drafter
    first = calibrate(target, drafter, max_batch=4, max_gamma=3, budget_s=2.0, cache_dir=str(tmp_path))
    files = list(tmp_path.iterdir())
    assert len(files) == 1
    again = calibrate(target, drafter, max_batch=4, max_gamma=3, budget_s=2.0, cache_dir=str(tmp_path))
    assert again.target.times == first.target.times  # read back, not re-measured
    assert all(t > 0 for row in first.target.times for t in row)


def test_auto_gamma_greedy_output_equals_plain_decoding(tmp_path):
    target, drafter = tiny_lm("llama"), noisy_copy("llama")
    prompts = make_prompts(9, 2, 9)
    params = SamplingParams(max_new_tokens=24, temperature=0)
    plain = SpecEngine(target, None, EngineConfig(max_batch_size=4, max_seq_len=64, gamma=0)).generate(prompts, params)
    auto = SpecEngine(target, drafter, EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto", max_gamma=4,
                                                    calibration_cache=str(tmp_path), cost_model_budget_s=1.0))
    # Force the policy through several γ values, plain steps included, within one call.
    schedule = iter([4, 0, 0, 3, 1, 0, 2] * 100)
    auto.gamma_policy.choose = lambda shape, greedy: next(schedule)
    out = auto.generate(prompts, params)
    assert [r.completion_ids for r in out] == [r.completion_ids for r in plain]
    assert set(auto.stats.gamma_per_step) == {0, 1, 2, 3, 4}


def test_engine_feeds_the_time_corrections(tmp_path):
    engine = SpecEngine(tiny_lm("llama"), noisy_copy("llama"),
                        EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto", max_gamma=4,
                                     calibration_cache=str(tmp_path), cost_model_budget_s=1.0))
    engine.generate(make_prompts(4, 2, 9), SamplingParams(max_new_tokens=16, temperature=0))
    policy = engine.gamma_policy
    assert policy.draft_scale != 1.0 and policy.draft_scale > 0  # drafting was timed on its own
    assert set(policy.overhead) <= {1, 2, 3, 4} and 4 in policy.overhead
    assert any(policy.reached[True]) and not any(policy.reached[False])  # greedy evidence only


def test_engine_host_lengths_follow_the_device_through_continuous_batching(tmp_path):
    # The policy's view of the batch (its KV length) comes from host copies of the row lengths; they
    # must match the device buffers after every step, through finishes, moves and admissions.
    engine = SpecEngine(tiny_lm("llama"), noisy_copy("llama"),
                        EngineConfig(max_batch_size=3, max_seq_len=64, gamma="auto", max_gamma=2,
                                     calibration_cache=str(tmp_path), cost_model_budget_s=1.0))
    prompts = make_prompts(7, 2, 9)
    steps = engine.generate_steps(prompts, SamplingParams(max_new_tokens=20, temperature=1.0, seed=3),
                                  max_new_tokens=[3, 20, 7, 1, 12, 5, 9])
    rows, checked = engine.rows, 0
    while True:
        try:
            live = next(steps)
        except StopIteration:
            break
        assert rows.host_seq_len[:live] == rows.seq_len[:live].tolist()
        if live:
            shape = engine._shape(live)
            assert shape.context == int(rows.seq_len[:live].max())
            checked += 1
    assert checked > 5  # 57 tokens in 3 slots at most 3 tokens per row-step (γ ≤ 2): at least 7 steps
