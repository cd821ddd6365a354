"""Drafter-invariant sampling: with `sampler="invariant"` speculative output is plain decoding's, token
for token (fp32), whatever the drafter, γ, batch size or slot order.

The target has spread-out distributions (`logit_scale` 15: ~3 nats of entropy at T = 1), so drafts
are rejected often; 12 prompts × 2 samples run in 5 slots, so finished rows are refilled mid-call.
The reference is a plain engine (no drafter) on the same seed.
"""

from __future__ import annotations

import copy
import functools
import random

import pytest
import torch
from tiny_models import make_prompts, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.version import DrafterVersion
from specroll.rollout.sampling import accept
from specroll.rollout.sampling import noise as noise_module
from specroll.rollout.sampling.draft_q import DraftQ
from specroll.rollout.sampling.noise import StepNoise

PROMPTS = make_prompts(12, 2, 9, seed=4)
N = 2
STOP = (3,)  # ends ~1 row in 3 early: slots are refilled at different steps
PARAMS = {
    "T1": SamplingParams(max_new_tokens=24, temperature=1.0, stop_token_ids=STOP, seed=11),
    "T0.7-k8": SamplingParams(max_new_tokens=24, temperature=0.7, top_k=8, stop_token_ids=STOP, seed=12),
    "T1.3-p0.8": SamplingParams(max_new_tokens=24, temperature=1.3, top_p=0.8, stop_token_ids=STOP, seed=13),
}
GAMMAS = [1, 4, "auto"]


def target() -> torch.nn.Module:
    return tiny_lm("llama", logit_scale=15.0)


@functools.cache
def good_drafter() -> torch.nn.Module:
    """The target with noise on `lm_head`: agrees on most tokens, not all."""
    model = copy.deepcopy(target())
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        w = model.lm_head.weight
        w.add_(0.3 * w.std() * torch.randn(w.shape, generator=gen))
    return model


DRAFTERS = {
    "good": good_drafter,
    "random": lambda: tiny_lm("qwen2", logit_scale=15.0, seed=7),  # another architecture, unrelated weights
    "self": lambda: copy.deepcopy(target()),
}


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("calibration"))


def engine(drafter: str | None, gamma: int | str, calibration: str, sampler: str = "invariant",
           slots: int = 5) -> SpecEngine:
    return SpecEngine(target(), DRAFTERS[drafter]() if drafter else None,
                      EngineConfig(max_batch_size=slots, max_seq_len=64, gamma=gamma, max_gamma=4, sampler=sampler,
                                   calibration_cache=calibration, cost_model_budget_s=0.5))


@functools.cache
def plain(params_name: str) -> list[list[int]]:
    rollouts = engine(None, 0, "", slots=16).generate(PROMPTS, PARAMS[params_name], n=N)
    return [r.completion_ids for r in rollouts]


def tokens(rollouts) -> list[list[int]]:
    return [r.completion_ids for r in rollouts]


@pytest.mark.parametrize("gamma", GAMMAS, ids=str)
@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("params_name", list(PARAMS))
def test_speculative_output_equals_plain_decoding(params_name, drafter, gamma, calibration):
    spec = engine(drafter, gamma, calibration)
    assert tokens(spec.generate(PROMPTS, PARAMS[params_name], n=N)) == plain(params_name)
    stats = spec.stats
    assert stats.drafted > 0 or gamma == "auto"
    if drafter == "self":  # the drafter is the target: every draft is the target's token
        assert stats.accepted == stats.drafted


def test_plain_decoding_is_the_same_under_both_samplers(calibration):
    rejection = engine(None, 0, calibration, sampler="rejection", slots=16)
    assert tokens(rejection.generate(PROMPTS, PARAMS["T1"], n=N)) == plain("T1")


def test_shuffled_order_and_fewer_slots_keep_each_requests_tokens(calibration):
    order = list(range(len(PROMPTS)))
    random.Random(0).shuffle(order)
    spec = engine("good", 4, calibration, slots=3)
    out = spec.generate([PROMPTS[i] for i in order], PARAMS["T1"], n=N, prompt_indices=order)
    reference = plain("T1")
    assert tokens(out) == [reference[i * N + j] for i in order for j in range(N)]
    assert [(r.prompt_index, r.sample_index) for r in out] == [(i, j) for i in order for j in range(N)]


def test_chunks_with_their_indices_give_the_whole_calls_tokens(calibration):
    """What a Ray controller does with two workers: each chunk of prompts passes its prompts' indices."""
    spec = engine("good", 2, calibration)
    halves = [range(0, 5), range(5, len(PROMPTS))]
    out = [r for half in halves
           for r in spec.generate([PROMPTS[i] for i in half], PARAMS["T1"], n=N, prompt_indices=list(half))]
    assert tokens(out) == plain("T1")


def test_drafter_swap_mid_call_and_between_calls(calibration):
    spec = engine("good", 3, calibration)
    steps = spec.generate_steps(PROMPTS, PARAMS["T0.7-k8"], n=N)
    for _ in range(4):
        next(steps)
    unrelated = tiny_lm("llama", logit_scale=15.0, seed=9)  # the target's architecture, other weights
    spec.drafter.load_weights(unrelated.state_dict())  # what `load_drafter` writes, here between two steps
    while True:
        try:
            next(steps)
        except StopIteration as done:
            assert tokens(done.value) == plain("T0.7-k8")
            break
    spec.load_drafter(DrafterVersion(2, good_drafter().state_dict()))
    assert tokens(spec.generate(PROMPTS, PARAMS["T1.3-p0.8"], n=N)) == plain("T1.3-p0.8")


def test_greedy_equals_todays_greedy(calibration):
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    spec = engine("good", 4, calibration)
    reference = engine("good", 4, calibration, sampler="rejection")
    assert tokens(spec.generate(PROMPTS, greedy)) == tokens(reference.generate(PROMPTS, greedy))


def test_unseeded_call_records_a_seed_that_regenerates_it(calibration):
    unseeded = SamplingParams(max_new_tokens=24, temperature=1.0)
    first = engine("good", "auto", calibration).generate(PROMPTS[:4], unseeded, n=N)
    seeds = {r.seed for r in first}
    assert len(seeds) == 1 and None not in seeds
    again = SamplingParams(max_new_tokens=24, temperature=1.0, seed=seeds.pop())
    one = first[5]  # prompt 2, sample 1
    regenerated = engine(None, 0, calibration).generate([PROMPTS[one.prompt_index]], again, n=one.sample_index + 1,
                                                       prompt_indices=[one.prompt_index])
    assert regenerated[-1].completion_ids == one.completion_ids
    assert engine("good", 4, calibration).generate(PROMPTS[:4], unseeded)[0].seed != first[0].seed


def test_a_cpu_step_draws_noise_only_where_a_token_is_read_and_keeps_every_verdict(monkeypatch):
    """On a CPU the invariant rule draws position i's noise only for rows that kept every draft before it; the
    verdict (kept drafts, next token, their tokens) is the every-position draw's, exactly, and the noise drawn
    shrinks with the rejections."""
    gen = torch.Generator().manual_seed(3)
    n, gamma, vocab = 64, 5, 50
    p = torch.softmax(3 * torch.randn(n, gamma + 1, vocab, generator=gen), -1)
    p[7, 2] = float("nan")  # a position with no distribution
    keys = torch.randint(0, 2**62, (n,), generator=gen)
    start = torch.randint(5, 40, (n,), generator=gen)
    eager_noise = StepNoise(keys, start, gamma + 1, vocab, greedy=False)
    target_tokens = torch.stack([noise_module.gumbel_max(p[:, i], eager_noise.token_row(i)) for i in range(gamma + 1)],
                                1)
    # Drafts that agree with the target's tokens for a random number of positions, then differ.
    agree = torch.randint(0, gamma + 1, (n,), generator=gen)
    drafts = torch.where(torch.arange(gamma) < agree[:, None], target_tokens[:, :gamma],
                         (target_tokens[:, :gamma] + 1) % vocab)
    draft_ok = torch.arange(gamma) < torch.randint(0, gamma + 1, (n,), generator=gen)[:, None]
    q = DraftQ.points(n, vocab, p.device)
    rule = accept.InvariantSampling()
    drawn = []
    real_gumbel = noise_module.gumbel
    monkeypatch.setattr(noise_module, "gumbel", lambda k, *a, **kw: drawn.append(len(k)) or real_gumbel(k, *a, **kw))
    lazy = rule.verify(drafts, q, p, StepNoise(keys, start, gamma + 1, vocab, greedy=False), draft_ok)
    lazy_rows = sum(drawn)
    monkeypatch.setattr(noise_module, "DRAW_ONLY_WHAT_IS_READ", frozenset())
    drawn.clear()
    eager = rule.verify(drafts, q, p, StepNoise(keys, start, gamma + 1, vocab, greedy=False), draft_ok)
    assert sum(drawn) == n * (gamma + 1)
    assert lazy_rows < n * (gamma + 1) / 2
    assert torch.equal(lazy.accepted_len, eager.accepted_len) and torch.equal(lazy.accepted, eager.accepted)
    assert torch.equal(lazy.next_token, eager.next_token)
    assert torch.equal(lazy.no_distribution, eager.no_distribution)
    read = torch.arange(gamma + 1) <= lazy.accepted_len[:, None]  # the kept drafts and the next token
    assert torch.equal(lazy.tokens[read], eager.tokens[read])
    assert 0 < int(lazy.accepted_len.sum()) < n * gamma  # some kept, some rejected: both paths exercised
