"""The drafter checks on the in-process backend: a drafter whose weights are replaced under the engine after a
drafter event is caught by its first batch — the collapse alarm, a digest mismatch (reloaded), the watchdog's
revert — and the engine ends on the learner's published drafter, acceptance back within 0.05 of before."""

from __future__ import annotations

import copy

import torch
from tiny_models import noisy_copy, tiny_lm

from specroll.integrations.backend import learner_round
from specroll.integrations.local_backend import LocalBackend
from specroll.online_drafter import LearnerConfig
from specroll.rollout import EngineConfig, SamplingParams

LEARNER = LearnerConfig(lr=1e-3, max_steps=4, batch_size=4, holdout_fraction=0.5, warmup_steps=0)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12], [13, 14, 15, 16], [17, 18]]
SAMPLED = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5)


def lose_weights(model: torch.nn.Module, token: int) -> None:
    """The drafter's weights replaced in place, its version unchanged: it then proposes `token` everywhere."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.zero_()
            if "norm" in name or name.endswith("embed_tokens.weight"):
                param.fill_(1.0)
        model.lm_head.weight[token] = 1.0


def test_weights_lost_under_the_engine_raise_the_alarm_and_are_reverted():
    drafter = copy.deepcopy(noisy_copy())
    backend = LocalBackend.from_models(copy.deepcopy(tiny_lm()), drafter,
                                       EngineConfig(max_batch_size=8, max_seq_len=64, gamma=2), LEARNER)
    backend.generate(PROMPTS, SAMPLED, n=2)
    learner_round(backend)
    backend.sync_policy({}, version=1)
    rollouts = backend.generate(PROMPTS, SAMPLED, n=2)  # the first batch after the sync: judged, healthy
    before = backend.batch_stats().acceptance_rate
    assert before > 0.3 and backend.metrics()["drafter/collapse_alarms"] == 0
    backend.sync_policy({}, version=2)
    unused = sorted(set(range(backend.engine.vocab_size)) - {t for r in rollouts for t in r.completion_ids})
    lose_weights(drafter, unused[0])
    version = backend.engine.drafter_version
    backend.generate(PROMPTS, SAMPLED, n=2)
    metrics = backend.metrics()
    assert metrics["drafter/collapse_alarms"] == 1 and metrics["drafter/digest_mismatches"] == 1
    assert backend.engine.drafter_version == backend.learner.version == version + 1  # the revert, a new version
    assert any(e.startswith("ALARM drafter collapse after policy sync to version 2") for e in backend.watch.events)
    served = backend.engine.served_drafter_digest(drafter)
    assert served == backend.learner.published_version().digest(backend.engine.config.dtype)
    backend.generate(PROMPTS, SAMPLED, n=2)
    assert abs(backend.batch_stats().acceptance_rate - before) <= 0.05
