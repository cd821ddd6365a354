"""TokenCounts: how often the policy emits each token lately — what the online draft vocabulary is chosen from.

Counts of completion tokens, per policy version: when rollouts of a newer version arrive, every count is
multiplied by `decay` per version it aged, so the most counted ids follow the policy's token frequencies as
GRPO moves them (the style it drifts to brings its own tokens). `top(size)` is the draft vocabulary they give
(`rollout.drafters.draft_vocab.top_ids`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specroll.rollout.drafters.draft_vocab import top_ids


class TokenCounts:
    def __init__(self, vocab_size: int, decay: float):
        self.counts = torch.zeros(vocab_size, dtype=torch.float64)
        self.decay = decay
        self.policy_version: int | None = None
        self.total = 0  # tokens counted, undecayed

    def add(self, tokens: torch.Tensor, policy_version: int) -> None:
        """Count a completion's tokens [T] emitted at `policy_version` (ids past the vocabulary are ignored)."""
        if self.policy_version is None or policy_version > self.policy_version:
            if self.policy_version is not None:
                self.counts *= self.decay ** (policy_version - self.policy_version)
            self.policy_version = policy_version
        weight = self.decay ** (self.policy_version - policy_version)  # an older version's late rollouts weigh less
        tokens = tokens[(tokens >= 0) & (tokens < self.counts.shape[0])].long()
        self.counts += torch.bincount(tokens, minlength=self.counts.shape[0]).double() * weight
        self.total += int(tokens.numel())

    def top(self, size: int, always: Iterable[int] = ()) -> torch.Tensor:
        """The `size` most counted ids, sorted (`always` included)."""
        return top_ids(self.counts, size, always)


class DraftVocabs:
    """The learner's draft vocabularies: each drafter's subset ("frozen", "published", "candidate", [N] sorted ids)
    and the token counts the candidate's is recounted from (`Learner.set_draft_vocab`)."""

    def __init__(self, ids: torch.Tensor, vocab_size: int, decay: float):
        ids = torch.as_tensor(ids).long().unique(sorted=True).cpu()
        self.ids = dict.fromkeys(("frozen", "published", "candidate"), ids)
        self.counts = TokenCounts(vocab_size, decay)

    def count(self, rollouts) -> None:
        """Count the completion tokens of `rollout.Rollout`s at their policy versions."""
        for rollout in rollouts:
            self.counts.add(torch.tensor(rollout.completion_ids, dtype=torch.long), rollout.policy_version)

    def recount(self) -> bool:
        """The candidate's subset becomes the most counted ids (as many as it has); True if that changed it."""
        if not self.counts.total:
            return False
        ids = self.counts.top(self.ids["candidate"].numel())
        changed = not torch.equal(ids, self.ids["candidate"])
        self.ids["candidate"] = ids
        return changed

    def state(self) -> dict:
        counts = self.counts
        return {**self.ids, "counts": counts.counts, "total": counts.total,
                "policy_version": -1 if counts.policy_version is None else counts.policy_version}

    def load(self, state: dict) -> None:
        self.ids.update({name: state[name] for name in self.ids})
        counts = self.counts
        counts.counts, counts.total = state["counts"].clone(), int(state["total"])
        counts.policy_version = None if int(state["policy_version"]) < 0 else int(state["policy_version"])
