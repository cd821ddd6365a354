"""VllmBackend: the in-process backend on vLLM — `LocalBackend`'s learner, gate, probe and drafter checks over a
`VllmEngine` instead of specroll's engine.

    backend = VllmBackend.from_models(target, drafter, EngineConfig(gamma=3, drafters=("model",)), LearnerConfig())
    trainer = GRPOTrainer(..., rollout_func=SpecrollRolloutFunc(backend))

What differs from `LocalBackend`, and only that, is here: the engine is vLLM (signals from a forward of the
target copy, `signals.TargetSignals`); a published drafter reaches vLLM's proposer as a `DrafterVersion`; the
digest check asks every vLLM worker which version it serves (`VllmEngine.served_drafter_digests`: a worker whose
drafter is gone or half-written answers None) and loads the published one again where it is not — after every
publish, policy sync, wake (`allocate`) and resume, and before every batch, so a lost drafter is repaired before
the batch it would have slowed. The engine keeps no resumable state of its own (vLLM's prefix cache is a cache).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import PreTrainedModel

from specroll.integrations.local_backend import LocalBackend
from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.online_learner import make_online_learner
from specroll.rollout import EngineConfig, Rollout, SamplingParams
from specroll.rollout.drafters.draft_vocab import initial_ids
from specroll.rollout.drafters.version import DrafterVersion

from .engine import VllmEngine
from .settings import VllmSettings

WORKER = "vllm worker {}"


class VllmBackend(LocalBackend):
    """`LocalBackend` over a `VllmEngine` (see the module doc)."""

    engine: VllmEngine

    @classmethod
    def from_models(cls, target: PreTrainedModel, drafter: PreTrainedModel | None,
                    engine_config: EngineConfig | None = None, learner_config: LearnerConfig | None = None,
                    target_tokenizer=None, drafter_tokenizer=None, settings: VllmSettings | None = None,
                    ) -> VllmBackend:
        """The vLLM engine on `target` and the drafter LM, and a learner on a private copy of the drafter when
        `learner_config` is given; `target` itself records the learner's signals and follows every policy sync."""
        engine_config = engine_config or EngineConfig()
        learner = None
        if learner_config is not None:
            if drafter is None:
                raise ValueError("learner_config needs a drafter to train, but drafter is None")
            engine_config = dataclasses.replace(engine_config, record_signals=True)
            learner = make_online_learner(drafter, target, learner_config)
            if engine_config.draft_vocab is not None:
                learner.set_draft_vocab(initial_ids(engine_config.draft_vocab, target.config.vocab_size, target.config,
                                                    drafter), target.config.vocab_size)
        engine = VllmEngine.from_models(target, drafter, engine_config, settings, target_tokenizer)
        return cls(engine, learner, None)

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Rollout]:
        if self.learner is not None:
            self._join_round()
            self._verify("batch start")
        return super().generate(prompts, params, n)

    def allocate(self) -> None:
        """Wake the engine, then check every worker's drafter (a wake is where users lose it)."""
        self.engine.allocate()
        self._verify("wake")

    def engine_states(self) -> list[dict[str, Any]]:
        return []

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict({**state, "engines": []})

    def _published(self) -> DrafterVersion:
        weights = self.learner.published_state_dict()
        return DrafterVersion(self.learner.version, {k: v for k, v in weights.items() if not k.startswith("specroll")
                                                     and k != "draft_vocab.ids"})

    def _serve_published(self, event: str) -> None:
        self.engine.load_drafter(self._published())
        self._verify(f"{event} of version {self.learner.version}")

    def _verify(self, event: str) -> None:
        """Every worker's served drafter digest against the learner's published version; reloaded where it
        differs (an event, `drafter/digest_mismatches`), and the collapse check armed for the next batch."""
        if self.learner is None:
            return
        if self._published_digest[0] != self.learner.version:  # hashed once per version
            self._published_digest = (self.learner.version, self._published().digest())
        published = self._published_digest[1]
        served = {WORKER.format(i): digest or "none" for i, digest in enumerate(self.engine.served_drafter_digests())}
        if event == "batch start" and all(d == published for d in served.values()):
            return  # nothing to record: the common case, checked before every batch
        if self.watch.checked(event, served, published, self.learner.version):
            self.engine.load_drafter(self._published())

    def sync_policy(self, named_tensors, version: int) -> float:
        return super().sync_policy({k: v.detach() if isinstance(v, torch.Tensor) else v
                                    for k, v in named_tensors.items()}, version)
