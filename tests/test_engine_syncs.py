"""Host↔device syncs per steady-state engine step, counted through the public `generate_steps`.

On a GPU each of these blocks the host until the device has caught up (or copies through the host):
a tensor's `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `int()` / `float()` / `bool()` / `operator.index()`
of it, `torch.tensor` / `torch.as_tensor` with a device (a host→device copy), `torch.cuda.synchronize`.
The test runs on CPU, where none of them costs anything, and counts every call as if it were one — a CPU
tensor's `.tolist()` is the call that would sync on CUDA. Steady state: every row live, none finishing or
admitted (a finished row's export and a new row's prefill cost their own copies, once per row, not per step).

Bar (issue #36): at most 2 per step for plain decoding, the model drafter, EAGLE and suffix + model, at a
fixed γ and at auto-γ, greedy and sampled. The engine does better and is held to what its docstring says:
one device→host copy per step, plus one host→device copy of the suffix drafter's drafts. Each failure names
the call sites.
"""

from __future__ import annotations

import collections
import contextlib
import traceback

import pytest
import torch
from tiny_models import make_prompts, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.heads import EagleHead
from specroll.rollout.step import chain as engine

# The bar: 2 for all. A paged cache adds one host→device copy of new block-table entries on a step where
# a row enters a new block.
MAX_SYNCS_PER_STEP = {"plain": 1, "model": 1, "eagle": 1, "eagle3": 1, "suffix+model": 2,
                      "plain-paged": 2, "model-paged": 2}
WARM_STEPS, COUNTED_STEPS = 2, 5  # counted steps emit ≤ 5 · (max_gamma + 1) = 35 tokens: no row ends
PROMPTS = make_prompts(4, 3, 9)
COPYING_METHODS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")


class SyncCounter:
    """Counts the calls that would sync on a device, by the engine's source line that made them."""

    def __init__(self):
        self.sites: collections.Counter[str] = collections.Counter()
        self.active = False

    def hit(self) -> None:
        if not self.active:
            return
        frames = [f for f in traceback.extract_stack()[:-2] if "/rollout/" in f.filename]
        where = f"{frames[-1].filename.split('/rollout/')[-1]}:{frames[-1].lineno}" if frames else "outside rollout/"
        self.sites[where] += 1

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    @contextlib.contextmanager
    def patched(self, monkeypatch: pytest.MonkeyPatch):
        def counting(original, with_device_only: bool = False):
            def wrapper(*args, **kwargs):
                if not with_device_only or kwargs.get("device") is not None:
                    self.hit()
                return original(*args, **kwargs)
            return wrapper

        for name in COPYING_METHODS:
            monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch, "tensor", counting(torch.tensor, with_device_only=True))
        monkeypatch.setattr(torch, "as_tensor", counting(torch.as_tensor, with_device_only=True))
        monkeypatch.setattr(torch.cuda, "synchronize", counting(torch.cuda.synchronize))
        yield self


def syncs_per_step(engine: SpecEngine, params: SamplingParams, monkeypatch: pytest.MonkeyPatch) -> SyncCounter:
    counter = SyncCounter()
    with counter.patched(monkeypatch):
        steps = engine.generate_steps(PROMPTS, params, n=2)
        for _ in range(WARM_STEPS):
            assert next(steps) == 2 * len(PROMPTS)
        counter.active = True
        for _ in range(COUNTED_STEPS):
            assert next(steps) == 2 * len(PROMPTS)  # every row still live: steady state
        counter.active = False
        steps.close()
    return counter


def build(kind: str, gamma) -> SpecEngine:
    target = tiny_lm("llama", "sdpa", layers=2)
    config = dict(max_batch_size=8, max_seq_len=96, gamma=gamma, max_gamma=6, cost_model_budget_s=0.2)
    if kind.endswith("-paged"):
        kind, config = kind.removesuffix("-paged"), {**config, "kv_cache": "paged", "kv_block_size": 4}
    if kind == "plain":
        return SpecEngine(target, None, EngineConfig(**{**config, "gamma": 0}))
    if kind == "model":
        return SpecEngine(target, tiny_lm("llama", "sdpa", hidden=16, layers=1, seed=7), EngineConfig(**config))
    if kind == "eagle":
        return SpecEngine(target, EagleHead.for_target(target.config, seed=3), EngineConfig(**config))
    if kind == "eagle3":
        return SpecEngine(target, None, EngineConfig(**config, drafters=("eagle3",)))
    return SpecEngine(target, tiny_lm("llama", "sdpa", hidden=16, layers=1, seed=7),
                      EngineConfig(**config, drafters=("suffix", "model")))


CASES = [("plain", 0), ("model", 3), ("model", "auto"), ("eagle", 3), ("eagle", "auto"), ("eagle3", 3),
         ("eagle3", "auto"),
         ("suffix+model", 3), ("suffix+model", "auto"), ("plain-paged", 0), ("model-paged", 3)]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize(("kind", "gamma"), CASES, ids=[f"{k}-{g}" for k, g in CASES])
def test_steady_state_syncs_per_step(kind, gamma, temperature, monkeypatch):
    engine = build(kind, gamma)
    params = SamplingParams(max_new_tokens=64, temperature=temperature, seed=0)
    counter = syncs_per_step(engine, params, monkeypatch)
    assert counter.total <= MAX_SYNCS_PER_STEP[kind] * COUNTED_STEPS, dict(counter.sites)


def test_the_counter_sees_a_sync():
    """The counter is not blind: the calls it patches are counted, and a host-side op is not."""
    counter = SyncCounter()
    with pytest.MonkeyPatch.context() as monkeypatch, counter.patched(monkeypatch):
        counter.active = True
        x = torch.arange(4)
        x.tolist(), int(x[0]), x.sum().item(), torch.tensor([1], device="cpu"), torch.tensor([1])
        x + 1
    assert counter.total == 4


class AlwaysDrafting:
    """An adaptive γ policy (so the engine times its drafts) that always drafts 3, recording what it observes."""

    adaptive = True

    def __init__(self):
        self.draft_seconds: list[float | None] = []

    def choose(self, shape, greedy: bool) -> int:
        return 3

    def observe(self, shape, outcome, greedy: bool) -> None:
        self.draft_seconds.append(outcome.draft_seconds)

    def narrow(self, shape, expected_kept: list[float]) -> int:
        return len(expected_kept) - 1

    def break_even_acceptance(self, rows: int, context: int) -> float | None:
        return None


def test_auto_gamma_times_drafts_with_a_sync_only_on_sampled_steps(monkeypatch):
    """On an async device the draft clock syncs once per `DRAFT_TIMING_EVERY` drafting steps, not each; the
    other steps tell the policy their draft time is unknown."""
    spec = build("model", "auto")
    policy = spec.gamma_policy = AlwaysDrafting()
    monkeypatch.setattr(engine, "runs_async", lambda device: True)  # as on a GPU
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    spec.generate(PROMPTS, SamplingParams(max_new_tokens=80, temperature=0), n=2)
    steps = len(policy.draft_seconds)
    assert steps > 2 * engine.DRAFT_TIMING_EVERY  # the sampling is exercised
    assert len(syncs) == steps // engine.DRAFT_TIMING_EVERY
    timed = [i + 1 for i, seconds in enumerate(policy.draft_seconds) if seconds is not None]
    assert timed == [k * engine.DRAFT_TIMING_EVERY for k in range(1, len(syncs) + 1)]
