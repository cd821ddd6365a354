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
