"""LocalBackend: the in-process `RolloutBackend` — one `SpecEngine` and, optionally, an `OnlineLearner`.

For one machine without Ray (tests, notebooks, a single-GPU run)::

    backend = LocalBackend.from_models(target, drafter, EngineConfig(gamma="auto"), LearnerConfig())
    trainer = GRPOTrainer(..., rollout_func=SpecrollRolloutFunc(backend))

The drafter is a drafter LM (trained by a `DraftLearner`) or an EAGLE / Medusa head (`rollout.drafters.heads`,
with `EngineConfig.drafters` naming it; trained by a `HeadLearner`, which reads the engine's own
target's embedding and LM head — updated in place by every policy sync, so it follows the policy).
Every rollout batch is handed to the learner's buffer. `start_learner_round` runs the round (and
a probe, if asked) in a background thread while the trainer updates the policy — torch releases the
GIL in its kernels, so the two share the machine's cores — and `finish_learner_round` joins it and
loads the learner's drafter into the engine only when the version moved, so a round that measured
worse never changes what the engine drafts with. `sync_policy` and `generate` join a running round
first: the probe generates on the same engine. `state_dict` / `load_state_dict` (a resumed run) carry the
learner's state (`online_drafter.state.learner_state`), the engine's (`SpecEngine.state_dict`: the suffix history and
the γ statistics) and the rollout count. After every drafter publish, policy sync and resume the engine's drafter
is hashed and compared with the learner's published digest, and the first batch after it judged for a collapse
(`drafter_watch`: alarm, event, the watchdog's revert), as on Ray.

With `LearnerConfig(signals="trainer")` `generate` buffers no rollouts: the learner gets them from
`add_trainer_signals` once the TRL hook captured their signals in the trainer's forward (`trainer_signals()` says
what to capture: `signal_source.SignalRequest`). The engine still records its own for the probe's rollouts, which
no trainer forward sees.

A LocalBackend lives in one process and cannot be shared: under `accelerate launch` every rank
builds its own (its own engine and learner), and every rank syncs its own with the gathered weights.
One service for all ranks needs the Ray backend (`ray_backend.shared_service`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch
from transformers import PreTrainedModel

from specroll.integrations.threads import ThreadSetting
from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.online_learner import OnlineLearner, make_online_learner
from specroll.online_drafter.state.learner_state import restore, state_of
from specroll.rollout import EngineConfig, Rollout, SamplingParams, SpecEngine
from specroll.rollout.core.stats import BatchStats
from specroll.rollout.drafters.factory import initial_draft_vocab
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads
from specroll.rollout.drafters.version import DrafterVersion
from specroll.rollout.engine import engine_state, load_engine_state

from .backend import LearnerRound, ProbeRequest, name_prompt_ids, raise_for_errors
from .drafter_watch import DrafterWatch
from .signal_source import SignalRequest, resolve_source


class LocalBackend:
    """Runs rollouts on an engine in this process; implements `RolloutBackend`."""

    def __init__(self, engine: SpecEngine, learner: OnlineLearner | None = None,
                 drafter: torch.nn.Module | None = None, trainer_signals: SignalRequest | None = None):
        """`drafter`: the module the engine drafts with (its weights, hashed for the drafter checks; None: no
        digest check, the collapse check only). `trainer_signals`: the learner's signals come from the trainer's
        forward (`add_trainer_signals`), recorded as this asks; None: from the engine's verification."""
        if learner is not None and trainer_signals is None and not engine.config.record_signals:
            raise ValueError("a LocalBackend with a learner needs an engine with record_signals=True (the learner "
                             "trains on what verification records) or trainer_signals; LocalBackend.from_models "
                             "sets one")
        self.engine = engine
        self.learner = learner
        self.signal_request = trainer_signals
        self.last_batch = BatchStats()
        self.last_sync_s: float | None = None
        self.total_rollouts = 0  # returned by generate since the run began (a resumed run's from its checkpoint)
        self._round: threading.Thread | None = None
        self._round_result: dict[str, Any] | None = None  # the last round's, until finish_learner_round
        self._round_stop = threading.Event()  # set: the running round stops training (finish_learner_round(stop=True))
        self.drafter = drafter
        self.watch = DrafterWatch()

    @classmethod
    def from_models(
        cls,
        target: PreTrainedModel,
        drafter: PreTrainedModel | EagleHead | MedusaHeads | None,
        engine_config: EngineConfig | None = None,
        learner_config: LearnerConfig | None = None,
        target_tokenizer=None,
        drafter_tokenizer=None,
    ) -> LocalBackend:
        """Build the engine, and a learner on a private copy of the drafter when `learner_config` is given
        (`make_online_learner`: the learner of the drafter's kind).

        The engine records verification signals (and, for a head, hidden states) whenever there is a
        learner to feed (with `learner_config.signals` "trainer" for the probe's rollouts only: the training ones come
        with `add_trainer_signals`). The tokenizers, if given, let the engine compare vocabularies token by token.
        """
        engine_config = engine_config or EngineConfig()
        source = None
        if learner_config is not None:
            if drafter is None:
                raise ValueError("learner_config needs a drafter to train, but drafter is None")
            source = resolve_source(learner_config.signals, "specroll")
            engine_config = dataclasses.replace(engine_config, record_signals=True)
        # The learner copies the drafter before the engine takes it (a head is moved to the engine's dtype).
        learner = None if learner_config is None else make_online_learner(drafter, target, learner_config)
        engine = SpecEngine(target, drafter, engine_config, target_tokenizer, drafter_tokenizer)
        if learner is not None and engine_config.draft_vocab is not None:  # the engine's first subset, counted on
            learner.set_draft_vocab(initial_draft_vocab(engine_config, engine.vocab_size, target.config, drafter))
        request = None
        if source == "trainer":  # what verification would have recorded for this engine's drafter
            hidden = engine.drafter is not None and engine.drafter.wants_hidden
            layers = engine.target.capture_layers if hidden else None
            request = SignalRequest(engine_config.signal_top_k, hidden, layers)
        return cls(engine, learner, drafter, request)

    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Rollout]:
        self._join_round()
        before, started = self.engine.stats.totals(), time.perf_counter()
        rollouts = self.engine.generate(prompts, params, n)
        self.last_batch = dataclasses.replace(self.engine.stats.since(before),
                                              wall_time_s=time.perf_counter() - started)
        self.total_rollouts += len(rollouts)
        if self.learner is not None:
            if self.signal_request is None:
                self.learner.add_rollouts(rollouts)
            self._check_batch()
        raise_for_errors(rollouts, name_prompt_ids(prompts, n))
        return rollouts

    def batch_stats(self) -> BatchStats:
        return self.last_batch

    def sync_policy(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> float:
        self._join_round()
        started = time.perf_counter()
        self.engine.update_target(named_tensors, version)
        self.last_sync_s = time.perf_counter() - started
        self._verify(f"policy sync to version {version}")
        return self.last_sync_s

    def serves_all_ranks(self) -> bool:
        return False

    def trainer_signals(self) -> SignalRequest | None:
        return self.signal_request

    def add_trainer_signals(self, rollouts: list[Rollout]) -> None:
        if self.signal_request is None:
            raise RuntimeError("add_trainer_signals on a backend whose learner trains on the engine's signals "
                               "(learner.signals is not 'trainer')")
        self._join_round()
        self.learner.add_rollouts(rollouts)

    def await_policy(self, version: int) -> None:
        raise RuntimeError("a LocalBackend is not shared between trainer ranks (it lives in one process): every "
                           "rank syncs its own with sync_policy; share one service with the Ray backend")

    def start_learner_round(self, budget_s: float | None, probe: ProbeRequest | None = None) -> None:
        if self.learner is None:
            return
        if self._round_result is not None:
            raise RuntimeError("start_learner_round called twice: finish_learner_round collects the running round")
        break_even = self.engine.break_even_acceptance()
        result = self._round_result = {}
        stop = self._round_stop = threading.Event()

        def run() -> None:
            try:
                if probe is not None:  # not handed to the learner's buffer: a probe is never trained on
                    result["probe"] = self.learner.probe(self._probe_rollouts(probe))
                result["report"] = self.learner.train_round(budget_s, break_even, stop.is_set)
            except BaseException as err:  # re-raised in the caller's thread by finish_learner_round
                result["error"] = err

        self._round = threading.Thread(target=run, name="specroll-learner", daemon=True)
        self._round.start()

    def finish_learner_round(self, stop: bool = False) -> LearnerRound | None:
        if self._round_result is None:
            return None
        started = time.perf_counter()
        if stop:
            self._round_stop.set()
        self._join_round()
        result, self._round_result = self._round_result, None
        if "error" in result:
            raise result["error"]
        if self.learner.version != self.engine.drafter_version:
            self._serve_published("drafter publish")
        return LearnerRound(result.get("report"), result.get("probe"), time.perf_counter() - started,
                            self.watch.take_events())

    def _probe_rollouts(self, probe: ProbeRequest) -> list[Rollout]:
        """Fresh rollouts of the probe's prompts, with the signals the learner scores them on."""
        return self.engine.generate(probe.prompts, probe.params, probe.n)

    def published_drafter(self) -> DrafterVersion | None:
        return None if self.learner is None else self.learner.published_version()

    def _join_round(self) -> None:
        if self._round is not None:
            self._round.join()
            self._round = None

    def metrics(self) -> dict[str, float]:
        synced = {} if self.last_sync_s is None else {"sync/policy_s": self.last_sync_s}
        return {"rollout/policy_version": float(self.engine.policy_version),
                "drafter/version": float(self.engine.drafter_version),
                "rollout/total_rollouts": float(self.total_rollouts), **self.watch.metrics(), **synced}

    def state_dict(self) -> dict[str, Any]:
        if self._round_result is not None:
            raise RuntimeError("state_dict while a learner round runs: finish_learner_round collects it first")
        return {"learner": None if self.learner is None else state_of(self.learner),
                "total_rollouts": self.total_rollouts, "engines": self.engine_states(),
                "drafter_watch": self.watch.state_dict()}

    def engine_states(self) -> list[dict[str, Any]]:
        return [engine_state(self.engine)]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        learner = state["learner"]
        if (learner is None) != (self.learner is None):
            raise ValueError(f"the state {'has' if learner is not None else 'has no'} learner and this backend "
                             f"{'has' if self.learner is not None else 'has none'}: online_learning and the drafter "
                             "kind must be those of the run that saved it")
        self._join_round()
        engines = state.get("engines", [])
        if engines:  # a Ray run's: its first worker's engine
            load_engine_state(self.engine, engines[0])
        if learner is not None:
            restore(self.learner, learner, "the saved learner state")
            self._serve_published("resume")
        if "drafter_watch" in state:
            self.watch.load_state_dict(state["drafter_watch"])
        self.total_rollouts = int(state["total_rollouts"])

    def _serve_published(self, event: str) -> None:
        """Load the learner's published drafter into the engine, then check what the engine serves."""
        self.engine.load_drafter(self.learner.published_version())
        self._verify(f"{event} of version {self.learner.version}")

    def _verify(self, event: str) -> None:
        """The drafter checks after a drafter event (`drafter_watch`): the engine's drafter digest against the
        learner's published one (loaded again if it differs), and the collapse check armed for the next batch."""
        if self.learner is None:
            return
        version = self.learner.published_version()
        published = version.digest(self.engine.config.dtype)  # cached on the version: hashed once
        served = published if self.drafter is None else self.engine.served_drafter_digest(self.drafter)
        if self.watch.checked(event, {"engine": served}, published, version.number):
            self.engine.load_drafter(version)

    def _check_batch(self) -> None:
        """The first batch after a drafter event judged for a collapse: the alarm, an event, the watchdog's revert."""
        stats = {"engine": self.last_batch}
        collapsed = self.watch.judge(stats)
        if not collapsed or not self.watch.collapse_confirmed(collapsed, stats, self.learner.served_estimate(),
                                                              self.engine.drafter_version):
            return
        self._verify("drafter collapse")
        reason = f"rollouts: the engine kept almost no drafts of version {self.engine.drafter_version}"
        self.watch.events.append(self.learner.revert_served(reason))
        self._serve_published("watchdog revert")

    def process_threads(self) -> list[ThreadSetting]:
        """None besides the caller's: the engine and the learner run in this process."""
        return []

    def shutdown(self) -> None:
        self._join_round()
        self.learner = None

