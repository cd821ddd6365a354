"""A request's state inside the engine, and the `Rollout` it becomes when it finishes."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RolloutSignals:
    """What verification revealed at each completion position, for online draft learning.

    `topk_ids`/`topk_probs` [T, k]: the target's top-k processed probabilities (for greedy runs the
    T = 1 distribution, since the processed one is one-hot). `draft_ids` [T]: the drafted token at
    that position, -1 where none was drafted. `accepted` [T]: whether that draft was kept.
    """

    topk_ids: torch.Tensor
    topk_probs: torch.Tensor
    draft_ids: torch.Tensor
    accepted: torch.Tensor


@dataclass
class Rollout:
    """One finished completion.

    `logprobs[i]` is the target's log-probability of `completion_ids[i]` under the processed
    distribution (temperature, top-k, top-p applied; the raw T = 1 distribution for greedy runs).

    `finish_reason` is "stop" (emitted a stop token), "length" (reached its token budget) or "error":
    the target's logits were non-finite where the next token had to be drawn (a NaN/inf from the
    model on this input). An "error" rollout holds the tokens before that position and `error` says
    what was non-finite and where; it is not a sample of the policy, and consumers (the TRL hook, the
    Ray controller) refuse it. Other rows of the same batch are unaffected. `error` is None otherwise.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "error"
    num_drafted: int = 0
    num_accepted: int = 0
    policy_version: int = 0
    drafter_version: int = 0
    signals: RolloutSignals | None = None
    error: str | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0


@dataclass
class Request:
    """One (prompt, sample index) pair while it waits, runs in a slot, or has finished."""

    index: int
    prompt_ids: list[int]
    max_new_tokens: int
    status: Status = Status.WAITING
    slot: int = -1
    rollout: Rollout | None = field(default=None, repr=False)
