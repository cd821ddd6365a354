"""FeatureBuffer: the head learner's bounded replay store of `FeatureSequence`s, newest policy versions first.

The same bounds and recency weighting as the drafter LM's `DraftBuffer` (`BufferConfig`): at most
`max_positions` completion positions in all (the oldest sequences leave first), and a sequence of
policy version v is drawn with weight `recency_decay ** (newest − v)` — the policy moved, the head
should follow where it is now. Memory per sequence of P prompt and T completion tokens:
(P + T − 1) · 2H bytes of hidden states (float16), 8(P + T) of ids and 12k · T of top-k p; per
completion position ≈ 2H + 12k + 8 bytes plus the prompt's share (the demo target, H = 512, k = 16:
~1.2 KiB; the default 200k positions ≈ 240 MB).
"""

from __future__ import annotations

from collections import deque

import torch

from .head_data import FeatureBatch, FeatureSequence, collate
from .learner_config import BufferConfig


class FeatureBuffer:
    def __init__(self, config: BufferConfig):
        self.config = config
        self.sequences: deque[FeatureSequence] = deque()
        self.num_positions = 0

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.sequences)

    def add(self, sequences: list[FeatureSequence]) -> None:
        for seq in sequences:
            self.sequences.append(seq)
            self.num_positions += seq.num_positions
        while self.num_positions > self.config.max_positions and len(self.sequences) > 1:
            self.num_positions -= self.sequences.popleft().num_positions

    def sample_batches(self, num_batches: int, batch_size: int, generator: torch.Generator) -> list[FeatureBatch]:
        """`num_batches` batches of `batch_size` sequences (with replacement, version v weighted
        `recency_decay ** (newest − v)`), grouped by length as `DraftBuffer.sample_batches` groups them
        (a batch is padded to its longest sequence); the batches come in random order."""
        if not self.sequences:
            raise ValueError("sample from an empty feature buffer: add rollouts first")
        versions = torch.tensor([s.policy_version for s in self.sequences], dtype=torch.float64)  # [N]
        weights = self.config.recency_decay ** (versions.max() - versions)
        picks = torch.multinomial(weights, num_batches * batch_size, replacement=True, generator=generator)
        picked = sorted(picks.tolist(), key=lambda i: self.sequences[i].token_ids.shape[0])
        order = torch.randperm(num_batches, generator=generator).tolist()
        return [collate([self.sequences[i] for i in picked[b * batch_size:(b + 1) * batch_size]]) for b in order]
