"""A request's state inside the engine, and the `Rollout` it becomes when it finishes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..sampling.randomness import request_keys


@dataclass
class RolloutSignals:
    """What verification revealed at each completion position, for online draft learning.

    `topk_ids`/`topk_probs` [T, k]: the target's top-k processed probabilities (for greedy runs the
    T = 1 distribution, since the processed one is one-hot). `draft_ids` [T]: the drafted token at
    that position, -1 where none was drafted. `accepted` [T]: whether that draft was kept.
    `hidden` [P + T - 1, H] float16: the target's final-normed hidden state at every position of prompt
    and completion but the last (`drafters.hidden`), recorded only for a drafter that reads them —
    what its heads train on (2·H bytes per position); None otherwise.
    """

    topk_ids: torch.Tensor
    topk_probs: torch.Tensor
    draft_ids: torch.Tensor
    accepted: torch.Tensor
    hidden: torch.Tensor | None = None


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

    `seed`, `prompt_index` and `sample_index` name the rollout's random stream (the call's seed, drawn
    when the call had none, and the request's index in the caller's batch): `generate([prompt],
    SamplingParams(..., seed=seed), n=sample_index + 1, prompt_indices=[prompt_index])[-1]` regenerates it —
    token for token with the invariant sampler, and with the rejection sampler under the same γ schedule.
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
    seed: int | None = None
    prompt_index: int = 0
    sample_index: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0


@dataclass
class FinishedRow:
    """A finished row as `RowBuffers.export` copies it to the host, before it becomes a `Rollout`."""

    completion_ids: list[int]
    logprobs: list[float]
    stopped: bool
    num_drafted: int
    num_accepted: int
    signals: RolloutSignals | None
    error: str | None


@dataclass
class Request:
    """One (prompt, sample index) pair while it waits, runs in a slot (`slot` ≥ 0), or has finished
    (`rollout` set). `key` is its random-stream key (`sampling.randomness.request_keys`)."""

    prompt_index: int
    sample_index: int
    seed: int
    key: int
    prompt_ids: list[int]
    max_new_tokens: int
    slot: int = -1
    rollout: Rollout | None = field(default=None, repr=False)

    def finish(self, row: FinishedRow, policy_version: int, drafter_version: int) -> None:
        """Become a `Rollout` from the row the engine exported."""
        self.rollout = Rollout(
            prompt_ids=self.prompt_ids,
            completion_ids=row.completion_ids,
            logprobs=row.logprobs,
            finish_reason="error" if row.error else "stop" if row.stopped else "length",
            num_drafted=row.num_drafted,
            num_accepted=row.num_accepted,
            policy_version=policy_version,
            drafter_version=drafter_version,
            signals=row.signals,
            error=row.error,
            seed=self.seed,
            prompt_index=self.prompt_index,
            sample_index=self.sample_index,
        )


def make_requests(prompts: Sequence[Sequence[int]], n: int, budgets: list[int], seed: int,
                  prompt_indices: list[int]) -> list[Request]:
    """Sample j of prompt i as request i·n + j, keyed by (seed, prompt_indices[i], j)."""
    index = torch.arange(len(prompts) * n)  # [N]
    keys = request_keys(seed, torch.tensor(prompt_indices, dtype=torch.long)[index // n], index % n).tolist()
    return [
        Request(prompt_index=prompt_indices[i], sample_index=j, seed=seed, key=keys[i * n + j],
                prompt_ids=list(map(int, prompt)), max_new_tokens=budgets[i])
        for i, prompt in enumerate(prompts)
        for j in range(n)
    ]
