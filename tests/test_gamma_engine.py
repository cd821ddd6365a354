"""Auto γ inside the engine: greedy exactness when γ changes from step to step, the calibration
cache, and what the engine feeds the policy (cost corrections, host-side acceptance counts and row
lengths)."""

from __future__ import annotations

import torch
from gamma_helpers import with_acceptance
from tiny_models import make_prompts, noisy_copy, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.core.append import acceptance_counts
from specroll.rollout.gamma.calibration import calibrate


def test_calibration_is_cached_per_model_shape(tmp_path):
    engine = SpecEngine(tiny_lm("llama"), tiny_lm("llama", layers=1), EngineConfig(max_batch_size=4, max_seq_len=64))
    target, drafter = engine.target, engine.drafter
    first = calibrate(target, drafter, max_batch=4, max_gamma=3, budget_s=2.0, cache_dir=str(tmp_path))
    files = {path.name for path in tmp_path.iterdir()}  # the forwards, and the verified positions' sampling
    assert len(files) == 2 and {name.replace("-sampling", "") for name in files} == {min(files, key=len)}
    again = calibrate(target, drafter, max_batch=4, max_gamma=3, budget_s=2.0, cache_dir=str(tmp_path))
    assert again.target.times == first.target.times  # read back, not re-measured
    assert again.sampling == first.sampling
    assert all(t > 0 for row in first.target.times for t in row)


def test_auto_gamma_greedy_output_equals_plain_decoding(tmp_path):
    target, drafter = tiny_lm("llama"), noisy_copy("llama")
    prompts = make_prompts(9, 2, 9)
    params = SamplingParams(max_new_tokens=24, temperature=0)
    plain = SpecEngine(target, None, EngineConfig(max_batch_size=4, max_seq_len=64, gamma=0)).generate(prompts, params)
    auto = SpecEngine(target, drafter, EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto", max_gamma=4,
                                                    calibration_cache=str(tmp_path), cost_model_budget_s=1.0))
    # Force the policy through several γ values, plain steps included, within one call.
    policy = with_acceptance(auto.gamma_policy, 0.9)
    schedule = iter([4, 0, 0, 3, 1, 0, 2] * 100)
    policy.choose = lambda shape, greedy: next(schedule)
    out = auto.generate(prompts, params)
    assert [r.completion_ids for r in out] == [r.completion_ids for r in plain]
    assert set(auto.stats.gamma_per_step) == {0, 1, 2, 3, 4}


def test_engine_feeds_the_cost_corrections(tmp_path):
    engine = SpecEngine(tiny_lm("llama"), noisy_copy("llama"),
                        EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto", max_gamma=4,
                                     calibration_cache=str(tmp_path), cost_model_budget_s=1.0))
    engine.generate(make_prompts(4, 2, 9), SamplingParams(max_new_tokens=16, temperature=0))
    cost = engine.gamma_policy.cost
    assert cost.draft_scale is not None and cost.draft_scale > 0  # drafting was timed on its own
    assert set(cost.overhead) <= {1, 2, 3, 4} and 4 in cost.overhead


def test_host_tally_matches_counting_every_draft():
    # The engine hands the policy per-row integers (kept prefix, decided prefix, start state); the
    # tally must equal counting each draft position of each row by hand.
    gen = torch.Generator().manual_seed(0)
    for gamma in (1, 3, 6):
        n = 40
        kept = torch.randint(0, gamma + 1, (n,), generator=gen)
        decided = torch.randint(1, gamma + 2, (n,), generator=gen)  # num_emit: 1 … γ + 1
        state = torch.randint(0, 2, (n,), generator=gen)
        j = torch.arange(gamma)
        reached = (j <= kept[:, None]) & (j < decided[:, None])
        accepted = (j < kept[:, None]) & (j < decided[:, None])
        expect = [(m & (state[:, None] == s)).sum(0).tolist() for s in (0, 1) for m in (reached, accepted)]
        assert acceptance_counts(kept.tolist(), decided.tolist(), state.tolist(), gamma) == expect


def test_engine_host_lengths_follow_the_device_through_continuous_batching(tmp_path):
    # The policy's view of the batch (context, room) comes from host copies of the row lengths; they
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
        assert rows.host_max_len[:live] == rows.max_len[:live].tolist()
        if live:
            shape = engine._shape(live)
            room = (rows.max_len[:live] - rows.seq_len[:live] - 1).clamp(0, 2)
            assert shape.room == torch.bincount(room, minlength=3).tolist()
            assert shape.context == int(rows.seq_len[:live].max())
            checked += 1
    assert checked > 5  # 57 tokens in 3 slots at most 3 tokens per row-step (γ ≤ 2): at least 7 steps


def test_break_even_acceptance_comes_from_either_auto_policy(tmp_path):
    target, drafter = tiny_lm("llama"), noisy_copy("llama")
    for gamma in ("auto", "auto_simple"):
        engine = SpecEngine(target, drafter, EngineConfig(max_batch_size=4, max_seq_len=64, gamma=gamma, max_gamma=3,
                                                          calibration_cache=str(tmp_path), cost_model_budget_s=1.0))
        assert 0.0 < engine.break_even_acceptance() <= 1.0
    fixed = SpecEngine(target, drafter, EngineConfig(max_batch_size=4, max_seq_len=64, gamma=2))
    assert fixed.break_even_acceptance() is None


def test_a_drafters_catch_up_step_teaches_acceptance_but_not_time(tmp_path):
    """The first drafting step after a prefill (or after plain steps) catches the drafter up on every position it
    missed — a whole prompt for a head — so its time is no steady step's: folded in, one such step made drafting
    look 2.6-3.5x dearer everywhere. The policy learns acceptance from it, the cost corrections nothing."""
    from specroll.rollout.drafters.heads import EagleHead

    target = tiny_lm("llama")
    engine = SpecEngine(target, EagleHead.for_target(target.config, seed=0),
                        EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto", max_gamma=3, drafters=("eagle",),
                                     calibration_cache=str(tmp_path), cost_model_budget_s=0.5))
    policy = engine.gamma_policy
    schedule = iter([3, 3, 0, 2, 2] * 100)
    policy.choose = lambda shape, greedy: next(schedule)
    seen, timed = [], []
    observe, cost_observe = policy.observe, policy.cost.observe
    policy.observe = lambda shape, outcome, greedy: (seen.append(outcome), observe(shape, outcome, greedy))
    policy.cost.observe = lambda batch, gamma, *rest, **kw: (timed.append(gamma),
                                                             cost_observe(batch, gamma, *rest, **kw))
    engine.generate(make_prompts(4, 2, 6), SamplingParams(max_new_tokens=12, temperature=1.0, seed=0))
    gammas = [o.gamma for o in seen]
    assert gammas[:5] == [3, 3, 0, 2, 2]
    # after the prefill and after the plain step: catch-ups; drafting right after drafting: steady
    assert [o.catch_up for o in seen[:5]] == [True, False, False, True, False]
    assert timed[:3] == [3, 0, 2]  # the catch-up steps are left out of the time corrections ...
    assert policy.estimates[False].any_seen  # ... not out of what acceptance learns
