"""The `RolloutBackend` protocol: what the TRL hook and the main job need from a rollout service.

Two implementations stand behind it: an in-process one (one `SpecEngine` plus an
`online_drafter.OnlineLearner` in the trainer's process) and a Ray one (a controller over
`RolloutWorker` actors and a `LearnerActor`). Callers never know which they hold, and neither backend
knows which learner it hosts: a `DraftLearner` for a drafter LM, a `HeadLearner` for an EAGLE / Medusa
head.

Both report what a `generate` call did the same way: `batch_stats()` is its `BatchStats` (the
engine's counters over the call, summed over Ray workers) and `rollout_metrics` names them, so one set
of rollouts gives one set of numbers whichever backend made it (docs/metrics.md is the table).

Both refuse a rollout whose target logits were non-finite (`finish_reason="error"`) the same way:
`generate` raises `RolloutError` once every rollout of the call is in, and the error carries them all.

Online draft learning runs off the critical path: `start_learner_round` returns at once and the
round (and, every few steps, a probe of the served drafter on fresh rollouts of fixed prompts) runs
while the trainer updates the policy — in a thread of the trainer's process locally, on the learner
actor and idle workers on Ray; `finish_learner_round` collects it before the next rollout.

A run that resumes (`specroll train --resume`) takes back what the service had at a trainer checkpoint:
`state_dict()` is the learner's whole state (`online_drafter.state.learner_state`) and the rollouts generated
so far, `load_state_dict` restores it into a fresh service on the same models and serves the learner's
published drafter at its version on every engine; the policy comes with the next `sync_policy`.

Several trainer ranks (`accelerate launch`) either share one service (`serves_all_ranks()` True: the
Ray controller of `ray_backend.shared_service`) — the main rank then syncs and runs the learner for
everyone, and the other ranks `await_policy` — or each holds its own (`LocalBackend`: an engine in
the rank's own process cannot be shared), and every rank syncs its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from specroll.integrations.signal_source import SignalRequest
from specroll.integrations.threads import ThreadSetting
from specroll.rollout import Rollout, SamplingParams
from specroll.rollout.core.stats import BatchStats
from specroll.rollout.drafters.version import DrafterVersion


class RolloutBackend(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> list[Rollout]:
        """Complete every prompt n times; results in input order, a prompt's n samples consecutive.

        All n samples of one prompt (a GRPO group) are generated on the same engine. Raises
        `RolloutError` (see `raise_for_errors`) when any rollout ended with `finish_reason="error"`.
        """
        ...

    def batch_stats(self) -> BatchStats:
        """What the last `generate` call did: the engines' counters over it, `wall_time_s` the call's
        wall-clock seconds (see `rollout_metrics`)."""
        ...

    def sync_policy(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> float:
        """Load new policy weights on every engine; returns the seconds it took."""
        ...

    def serves_all_ranks(self) -> bool:
        """True when every trainer rank uses this one service: only the main rank syncs it and runs its
        learner; False when each rank holds its own backend."""
        ...

    def await_policy(self, version: int) -> None:
        """On a rank that does not sync a shared service: check that the service serves `version` (the
        main rank synced it) and accept rollouts from it. Raises when it does not, or when the backend
        is not shared."""
        ...

    def trainer_signals(self) -> SignalRequest | None:
        """What the trainer's forward must capture for the learner (`LearnerConfig.signals` "trainer": the TRL hook's
        `trl_hook.signal_capture`), None when the backend's learner gets its signals elsewhere (or it has none)."""
        ...

    def add_trainer_signals(self, rollouts: list[Rollout]) -> None:
        """Hand the learner rollouts of earlier `generate` calls whose `signals` the trainer's forward captured
        (as `trainer_signals()` asked). Raises RuntimeError where `trainer_signals()` is None."""
        ...

    def start_learner_round(self, budget_s: float | None, probe: ProbeRequest | None = None) -> None:
        """Begin one draft-learning round on the rollouts so far — after scoring `probe`, if given —
        and return at once. A no-op without a learner."""
        ...

    def finish_learner_round(self, stop: bool = False) -> LearnerRound | None:
        """Wait for the round `start_learner_round` began — `stop`: telling it to end its training now and gate
        what it has (the trainer needs the next rollouts: any later learner second is one it waits) — and
        publish its drafter to every engine if
        the version moved. None when no round is running (or there is no learner)."""
        ...

    def published_drafter(self) -> DrafterVersion | None:
        """The drafter version the learner publishes now (None without a learner)."""
        ...

    def metrics(self) -> dict[str, float]:
        """The service's state: `rollout/policy_version`, `drafter/version`, `rollout/total_rollouts` (rollouts
        `generate` returned since the run began, a resumed run's counted on from its checkpoint), `sync/policy_s`
        and `sync/drafter_s` once synced (and what only one backend has, e.g. Ray's `rollout/resends`)."""
        ...

    def engine_states(self) -> list[dict[str, Any]]:
        """What each engine learnt while it ran (`SpecEngine.state_dict`: suffix history, γ statistics; one per Ray
        worker), between `generate` calls: a measurement's fresh engine starts where the run's engines are."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of the service: `learner`, the learner's whole state
        (`online_drafter.state.learner_state.state_of`; None without a learner), `engines`, each engine's own state
        (`SpecEngine.state_dict`: suffix history, γ statistics; one per Ray worker), and `total_rollouts`. Raises
        RuntimeError while a learner round runs (`finish_learner_round` first) or on a service this rank does
        not drive."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back another service's `state_dict()` (same models and drafter kind) before the first
        `generate`: the learner's state, and its published drafter served at its version on every engine.
        Raises ValueError when one of the two has a learner and the other not, or the drafter does not fit."""
        ...

    def process_threads(self) -> list[ThreadSetting]:
        """The torch threads of each process the backend runs torch in besides the caller's (its Ray
        actors, as each reports them; none for an in-process backend)."""
        ...

    def shutdown(self) -> None:
        ...


def rollout_metrics(stats: BatchStats) -> dict[str, float]:
    """The logged `rollout/*` numbers of a `BatchStats` — the only place they are named. Each drafter
    kind that served rows adds `rollout/<kind>/{proposals,tokens,acceptance_rate,mean_accepted_len}`
    (`DrafterStats`; tokens = its drafts kept)."""
    metrics = {
        "rollout/tokens": float(stats.generated_tokens),
        "rollout/seconds": stats.wall_time_s,
        "rollout/tokens_per_s": stats.tokens_per_s,
        "rollout/acceptance_rate": stats.acceptance_rate,
        "rollout/position_acceptance": stats.position_acceptance,
        "rollout/mean_accepted_len": stats.mean_accepted_len,
        "rollout/gamma": stats.mean_gamma,
        "rollout/live_rows": stats.mean_live_rows,
    }
    if stats.tree_row_steps:  # trees ran (`EngineConfig.tree_width`)
        metrics.update({"rollout/tree_nodes_per_row": stats.tree_nodes_per_row,
                        "rollout/tree_accepted_len": stats.tree_accepted_len})
    for kind, share in sorted(stats.by_drafter.items()):
        metrics.update({
            f"rollout/{kind}/proposals": float(share.proposals),
            f"rollout/{kind}/tokens": float(share.accepted),
            f"rollout/{kind}/acceptance_rate": share.acceptance_rate,
            f"rollout/{kind}/mean_accepted_len": share.mean_accepted_len,
        })
    return metrics


@dataclass
class ProbeRequest:
    """Fresh rollouts of a fixed set of prompts, scored for the served vs the frozen drafter, never trained on."""

    prompts: list[list[int]]
    params: SamplingParams
    n: int


@dataclass
class LearnerRound:
    """What one background round did: the learner's `LearnerReport` (None when the learner was lost during it),
    the probe's `ProbeReport` (or None), the seconds `finish_learner_round` blocked for it (its share of the
    critical path), and the backend's drafter events since the last round (`drafter_watch`: digests that did not
    match, collapses — those starting "ALARM " are alarms —, a refused sync, a learner restarted)."""

    report: Any
    probe: Any
    wait_s: float
    events: list[str] = field(default_factory=list)


def learner_round(backend: RolloutBackend) -> LearnerRound | None:
    """One round, waited for: `start_learner_round` then `finish_learner_round` (scripts, tests)."""
    backend.start_learner_round(None)
    return backend.finish_learner_round()


class RolloutError(RuntimeError):
    """Some rollouts ended with `finish_reason="error"` (non-finite target logits).

    Raised once every rollout of the call is in: `rollouts` holds all of them in order, `failed` the
    indices of the failed ones, so a caller that catches it loses nothing that was generated.
    """

    def __init__(self, message: str, rollouts: list[Rollout], failed: list[int]):
        super().__init__(message)
        self.rollouts = rollouts
        self.failed = failed


def raise_for_errors(rollouts: list[Rollout], name_prompt: Callable[[int], str]) -> None:
    """Raise `RolloutError` when any rollout failed; `name_prompt(i)` names rollout i's prompt.

    The message gives the failed rollouts' indices and names each failed prompt once (the first
    three), with its first failed rollout's `error`.
    """
    failed = [i for i, r in enumerate(rollouts) if r.finish_reason == "error"]
    if not failed:
        return
    first_error: dict[str, str | None] = {}
    for i in failed:
        first_error.setdefault(name_prompt(i), rollouts[i].error)
    shown = "; ".join(f"{prompt}: {error}" for prompt, error in list(first_error.items())[:3])
    more = f"; and {len(first_error) - 3} more prompts" if len(first_error) > 3 else ""
    indices = ", ".join(map(str, failed[:8])) + (", ..." if len(failed) > 8 else "")
    raise RolloutError(f"{len(failed)} of {len(rollouts)} rollouts ended with an error (non-finite target "
                       f"logits; rollouts {indices}) — {shown}{more}", rollouts, failed)


def name_prompt_ids(prompts: Sequence[Sequence[int]], n: int) -> Callable[[int], str]:
    """Names rollout i of a `generate(prompts, params, n)` call by its prompt's index and first tokens."""
    def name(i: int) -> str:
        ids = list(prompts[i // n])
        head = ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
        return f"prompt {i // n} [{head}]"
    return name
