"""VllmBackend: the in-process backend on vLLM — `LocalBackend`'s learner, gate, probe and drafter checks over a
`VllmEngine` instead of specroll's engine.

    backend = VllmBackend.from_models(target, drafter, EngineConfig(gamma=3, drafters=("model",)), LearnerConfig())
    trainer = GRPOTrainer(..., rollout_func=SpecrollRolloutFunc(backend))

What differs from `LocalBackend`, and only that, is here: the engine is vLLM, which records no signals — the learner's
come from a forward of the target copy (`learner.signals: forward`, `signals.TargetSignals`) or from TRL's own loss
forward (`learner.signals: trainer`, `trl_hook.signal_capture`: the TRL hook hands them over with
`add_trainer_signals`); the drafter is a drafter LM (vLLM's draft-model proposer) or an EAGLE-3 head (its EAGLE-3
proposer: the head written in the speculators layout, `formats.eagle3`, each published version converted to those
names — with the policy's current embedding and LM head rows where the head reads the target's); a published
drafter reaches vLLM's proposer as a `DrafterVersion`; the
digest check asks every vLLM worker which version it serves (`VllmEngine.served_drafter_digests`: a worker whose
drafter is gone or half-written answers None) and loads the published one again where it is not — after every
publish, policy sync, wake (`allocate`) and resume, and before every batch, so a lost drafter is repaired before
the batch it would have slowed. The engine keeps no resumable state of its own (vLLM's prefix cache is a cache).
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from specroll.integrations.formats.eagle3 import save_eagle3_checkpoint, speculators_tensors
from specroll.integrations.local_backend import LocalBackend
from specroll.integrations.signal_source import SignalRequest, resolve_source
from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.online_learner import make_online_learner
from specroll.rollout import EngineConfig, Rollout, SamplingParams
from specroll.rollout.drafters.draft_vocab import carry
from specroll.rollout.drafters.factory import initial_draft_vocab
from specroll.rollout.drafters.heads.eagle3 import Eagle3Head
from specroll.rollout.drafters.version import DrafterVersion
from specroll.rollout.models.weights import copy_into

from .engine import VllmEngine
from .settings import VllmSettings
from .signals import TargetSignals

WORKER = "vllm worker {}"


class VllmBackend(LocalBackend):
    """`LocalBackend` over a `VllmEngine` (see the module doc)."""

    engine: VllmEngine
    _served: tuple[DrafterVersion, DrafterVersion] | None = None  # (the learner's version, as vLLM serves it)
    head: Eagle3Head | None = None  # an EAGLE-3 drafter's module, the learner's versions are written through
    policy: PreTrainedModel | None = None  # the policy copy the head's versions and the probe's signals read
    probe_signals: TargetSignals | None = None  # with trainer signals: the probe's rollouts see no trainer forward
    folder: tempfile.TemporaryDirectory | None = None  # the models' folder `from_models` wrote, removed with it

    @classmethod
    def from_models(cls, target: PreTrainedModel, drafter: PreTrainedModel | Eagle3Head | None,
                    engine_config: EngineConfig | None = None, learner_config: LearnerConfig | None = None,
                    target_tokenizer=None, drafter_tokenizer=None, settings: VllmSettings | None = None,
                    folder: str | None = None) -> VllmBackend:
        """The vLLM engine on `target` and the drafter (a drafter LM or an `Eagle3Head`), saved under `folder` (a
        temporary one by default, removed with the backend), and a learner on a private copy of the drafter when
        `learner_config` is given. `target` follows every policy sync where something reads it: the learner's
        signals (`learner.signals: forward`; with "trainer" the probe's), or an EAGLE-3 head's versions (the policy's
        embedding and LM head)."""
        engine_config = engine_config or EngineConfig()
        head = drafter if isinstance(drafter, Eagle3Head) else None
        if drafter is not None and engine_config.drafters is None:  # the drafter passed as itself, as SpecEngine takes
            engine_config = dataclasses.replace(engine_config, drafters=("eagle3",) if head is not None else ("model",))
        vocab = initial_draft_vocab(engine_config, target.config.vocab_size, target.config, drafter)
        learner, source = None, None
        if learner_config is not None:
            if drafter is None:
                raise ValueError("learner_config needs a drafter to train, but drafter is None")
            source = resolve_source(learner_config.signals, "vllm")
            learner = make_online_learner(drafter, target, learner_config)
            if vocab is not None:
                learner.set_draft_vocab(vocab)
        request = None if learner is None else signal_request(engine_config, head)
        engine_config = dataclasses.replace(engine_config, record_signals=source == "forward")
        keep = tempfile.TemporaryDirectory(prefix="specroll-vllm-") if folder is None else None
        root = Path(folder or keep.name)
        target.save_pretrained(root / "target")
        if target_tokenizer is not None:
            target_tokenizer.save_pretrained(root / "target")
        drafter_dir, first = None, None
        if head is not None:  # over the first draft vocabulary: vLLM's d2t / t2d keep their size from here on
            written = head if vocab is None or head.lm_head is not None else carry(copy.deepcopy(head), vocab.ids)
            drafter_dir = str(save_eagle3_checkpoint(written, target, root / "drafter", verifier=str(root / "target")))
            first = DrafterVersion(0, speculators_tensors(head, target, None if vocab is None else vocab.ids))
        elif drafter is not None:
            drafter.save_pretrained(root / "drafter")
            drafter_dir = str(root / "drafter")
        signals = None
        if source == "forward":
            signals = TargetSignals(target, request.top_k, request.hidden, request.capture_layers)
        engine = VllmEngine(str(root / "target"), drafter_dir, engine_config, settings,
                            tokenizer_dir=str(root / "target") if target_tokenizer is not None else None,
                            drafter=first, signals=signals)
        backend = cls(engine, learner, None, request if source == "trainer" else None)
        backend.folder = keep
        if head is not None:
            backend.head = copy.deepcopy(head).float().cpu()
        if source == "trainer":
            backend.probe_signals = TargetSignals(target, request.top_k, request.hidden, request.capture_layers)
        if head is not None or source == "trainer":
            backend.policy = target
        return backend

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

    def _probe_rollouts(self, probe) -> list[Rollout]:
        rollouts = super()._probe_rollouts(probe)
        if self.probe_signals is not None:  # the extra forward, on the probe's few rollouts only
            self.probe_signals.record(rollouts, probe.params)
        return rollouts

    def _published(self) -> DrafterVersion:
        """The learner's published version as vLLM serves it, one object per learner version (its digest is hashed
        once): a drafter LM's over the whole vocabulary (the draft-model proposer takes no draft vocabulary); an
        EAGLE-3 head's under the speculators layout's names, its draft vocabulary as `d2t` / `t2d`."""
        version = self.learner.published_version()
        if self._served is None or self._served[0] is not version:
            weights = version.weights
            if self.head is not None:
                self.head.load_state_dict(dict(version.weights))
                weights = speculators_tensors(self.head, self.policy, version.draft_vocab)
            self._served = (version, DrafterVersion(version.number, weights, None, version.acceptance,
                                                    version.invariant_acceptance))
        return self._served[1]

    def _serve_published(self, event: str) -> None:
        self.engine.load_drafter(self._published())
        self._verify(f"{event} of version {self.learner.version}")

    def _verify(self, event: str) -> None:
        """Every worker's served drafter digest against the learner's published version; reloaded where it
        differs (an event, `drafter/digest_mismatches`), and the collapse check armed for the next batch."""
        if self.learner is None:
            return
        published = self._published().digest()
        served = {WORKER.format(i): digest or "none" for i, digest in enumerate(self.engine.served_drafter_digests())}
        if event == "batch start" and all(d == published for d in served.values()):
            return  # nothing to record: the common case, checked before every batch
        if self.watch.checked(event, served, published, self.learner.version):
            self.engine.load_drafter(self._published())

    def sync_policy(self, named_tensors, version: int) -> float:
        named = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in named_tensors.items()}
        if self.policy is not None and (self.engine.signals is None or self.engine.signals.model is not self.policy):
            copy_into(self.policy, named, "target")  # the EAGLE-3 head's next versions read its embedding and LM head
        return super().sync_policy(named, version)


def signal_request(config: EngineConfig, head: Eagle3Head | None) -> SignalRequest:
    """What the learner trains on, as specroll's engine would record it: top-`signal_top_k` p, and for an EAGLE-3
    head the residual stream entering its target layers."""
    if head is None:
        return SignalRequest(config.signal_top_k)
    return SignalRequest(config.signal_top_k, hidden=True, capture_layers=tuple(head.target_layers))
