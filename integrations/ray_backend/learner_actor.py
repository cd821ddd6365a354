"""LearnerActor: the online learner (`online_drafter.OnlineLearner`) as a Ray actor.

It hosts the learner of the run's drafter kind (`make_online_learner`): a `DraftLearner` for a drafter
LM, a `HeadLearner` for an EAGLE / Medusa head — which reads the policy's embedding and LM head, so the
actor then keeps a copy of the policy and the controller sends it those tensors with every policy sync
(`policy_names` says which; none for a drafter LM).

The controller forwards each round's rollout ObjectRefs (the learner pulls them from the object
store itself, so rollouts do not pass through the driver twice), then queues `probe` (refs to the
probe rollouts idle workers are generating) and `train_round` without waiting: an actor runs its
calls in order, so the probe scores the drafter that served the step before the round replaces it,
and the whole round runs while the trainer updates the policy. The drafter weights live here; when
the round's report says the version moved, the controller fetches `published_state_dict` and syncs
it to the workers. Losing the learner costs learning, never rollouts: Ray restarts it (the topology's
`max_restarts`) and the controller (`learner_driver`) loads the state it took after the last round
(`state_dict`, a return value the controller owns, so it outlives this process) and adds the rollouts since.
Digests (`published_digest`) are computed here, over the published weights as they are, so the backend
compares them with what every worker hashes of what it serves (`integrations.drafter_watch`).
It runs torch on as many threads as it has whole CPUs
(`threads`), whatever `OMP_NUM_THREADS` it inherited: oversubscribed, a time-bounded round finishes
no optimizer step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from specroll.integrations.model_source import HEAD_KINDS, ModelPaths, load_drafter, trained_drafter_kind
from specroll.integrations.threads import ThreadSetting, current_threads, set_torch_threads
from specroll.integrations.weights_digest import weights_digest
from specroll.online_drafter import LearnerConfig
from specroll.online_drafter.online_learner import make_online_learner
from specroll.online_drafter.state.learner_state import has_state, restore, state_of
from specroll.rollout import EngineConfig
from specroll.rollout.drafters.draft_vocab import initial_ids
from specroll.rollout.models.weights import copy_into

from .metrics import LearnerMetrics
from .round_stop import StopPoll


@ray.remote
class LearnerActor:
    def __init__(self, models: ModelPaths, engine: EngineConfig, config: LearnerConfig, threads: int = 1):
        set_torch_threads(threads, "learner")  # before any torch work: the inter-op pool is sized once
        head = trained_drafter_kind(models, engine) in HEAD_KINDS
        # A head reads the policy's embedding and LM head: the actor holds the policy (kept current by
        # `load_policy`); a drafter LM needs none of it.
        self.policy = AutoModelForCausalLM.from_pretrained(models.target, dtype=torch.float32) if head else None
        drafter = load_drafter(models, engine, self.policy)
        self.learner = make_online_learner(drafter, self.policy, config)
        if engine.draft_vocab is not None:  # the workers' engines start from this subset (`initial_ids`)
            target_config = AutoConfig.from_pretrained(models.target)
            vocab_size = target_config.get_text_config().vocab_size
            self.learner.set_draft_vocab(initial_ids(engine.draft_vocab, vocab_size, target_config, drafter),
                                         vocab_size)
        self.metrics = LearnerMetrics()
        self.num_rollouts = 0  # added since start, from every controller (every rank of a shared service)
        self.num_rounds = 0

    def add_rollouts(self, batches: list[ray.ObjectRef]) -> int:
        """Add the rollouts of a round (refs to workers' `generate` results); returns how many."""
        rollouts = [r for batch in ray.get(batches) for r in batch.rollouts]
        self.learner.add_rollouts(rollouts)
        self.num_rollouts += len(rollouts)
        return len(rollouts)

    def train_round(self, budget_s: float | None, break_even: float | None, stop_key: str | None = None) -> Any:
        """One distillation round; returns the learner's `LearnerReport`. `stop_key`: the round's key in
        `round_stop` — its training ends once the controller writes it."""
        self.num_rounds += 1
        report = self.learner.train_round(budget_s, break_even, None if stop_key is None else StopPoll(stop_key))
        self.metrics.record_round(report)
        return report

    def draft_vocab(self, name: str = "published") -> list[int] | None:
        """The "frozen", "published" or "candidate" drafter's draft vocabulary (None: the whole vocabulary)."""
        ids = self.learner.draft_vocab(name)
        return None if ids is None else ids.tolist()

    def counts(self) -> dict[str, int]:
        """Rollouts added and rounds run since the actor started."""
        return {"rollouts": self.num_rollouts, "rounds": self.num_rounds}

    def threads(self) -> ThreadSetting:
        """The torch threads the learner runs with (as torch reports them in the thread that serves calls)."""
        return current_threads("learner")

    def probe(self, batches: list[ray.ObjectRef]) -> Any:
        """Score served vs frozen on probe rollouts (refs to workers' `generate` results); never buffered."""
        return self.learner.probe([r for batch in ray.get(batches) for r in batch.rollouts])

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """The drafter weights of the latest published version (what workers should serve), on the CPU: a
        learner on a GPU must not hand CUDA tensors to Ray (the driver would need that GPU to read them)."""
        return {name: tensor.detach().to("cpu") for name, tensor in self.learner.published_state_dict().items()}

    def published_digest(self, wire_dtype: torch.dtype | None) -> str:
        """The digest of the published drafter (`weights_digest`) as a sync in `wire_dtype` delivers it."""
        return weights_digest(self.learner.published_state_dict(), wire_dtype)

    def served_estimate(self) -> float:
        """The learner's held-out expected acceptance of the published drafter (nan before any is held out)."""
        return self.learner.served_estimate()

    def revert_served(self, reason: str) -> str:
        """The rollouts showed the served drafter collapsed: publish the best other drafter (`Learner.revert_served`);
        returns the event."""
        return self.learner.revert_served(reason)

    def published_version(self) -> int:
        return self.learner.version

    def restorable(self) -> bool:
        """Whether the learner has a state to save (a recording, `learner.record_dir`, is one run from its start)."""
        return has_state(self.learner)

    def state_dict(self) -> dict[str, Any]:
        """The learner's whole state (`online_drafter.state.learner_state.state_of`), for a resume or a restart."""
        return state_of(self.learner)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the learner from a `state_dict()` (of this run, or of the checkpoint it resumes)."""
        restore(self.learner, state, "the saved learner state")

    def policy_names(self) -> list[str]:
        """Names of the policy parameters the learner reads (the embedding and LM head a head shares), in
        the policy's own naming; empty when it reads none."""
        if self.policy is None:
            return []
        read = {id(self.policy.get_input_embeddings().weight), id(self.policy.get_output_embeddings().weight)}
        return [name for name, param in self.policy.named_parameters() if id(param) in read]

    def load_policy(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy the `policy_names` tensors of a new policy version into the policy the learner reads."""
        copy_into(self.policy, named_tensors, "the learner's policy")
