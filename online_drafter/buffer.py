"""DraftBuffer: a bounded replay store of what verification revealed, keyed by policy version.

The learner adds finished rollouts (context ids + the target's top-k at each completion position)
and samples batches to distil the drafter on. The policy moves every RL step, so sampling favours
the newest versions: a rollout of version v weighs `recency_decay ** (newest − v)`. Within a
rollout, positions where a draft was rejected weigh `rejected_weight` (others 1): that is where the
drafter and the target disagreed.

A rollout is drawn with probability ∝ recency × W (W = the sum of its position weights) and its
positions are weighted w_t / W in the loss, so in expectation each position counts ∝ recency × w_t,
whatever its rollout's length. When full (`max_positions`), the oldest rollouts of the oldest
version go first. `save` / `load` round-trip the contents so a run can resume (`checkpoint.py`:
written atomically, read back checked).
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import asdict

import torch

from specroll.rollout import Rollout

from .checkpoint import load_checkpoint, save_checkpoint
from .draft_batch import BufferedRollout, DraftBatch, collate
from .learner_config import BufferConfig


def to_buffered(rollout: Rollout) -> BufferedRollout:
    """Keep what learning needs of a rollout; `ValueError` if it was generated without signals."""
    signals = rollout.signals
    if signals is None:
        raise ValueError("rollout has no signals: generate with EngineConfig(record_signals=True)")
    num_pos = len(rollout.completion_ids)
    if num_pos == 0 or signals.topk_ids.shape[0] != num_pos:
        raise ValueError(
            f"rollout signals cover {signals.topk_ids.shape[0]} positions, completion has {num_pos}"
        )
    if not rollout.prompt_ids:
        raise ValueError("rollout has an empty prompt: the first completion token has no context")
    token_ids = torch.tensor(list(rollout.prompt_ids) + list(rollout.completion_ids), dtype=torch.long)
    return BufferedRollout(
        token_ids=token_ids,
        prompt_len=len(rollout.prompt_ids),
        topk_ids=signals.topk_ids.to("cpu", torch.long),
        topk_probs=signals.topk_probs.to("cpu", torch.float32),
        rejected=(signals.draft_ids >= 0).cpu() & ~signals.accepted.cpu(),
        policy_version=int(rollout.policy_version),
    )


class DraftBuffer:
    """Bounded store of `BufferedRollout`s; `sample` draws recency- and rejection-weighted batches."""

    def __init__(self, config: BufferConfig | None = None):
        self.config = config or BufferConfig()
        self._by_version: dict[int, list[BufferedRollout]] = defaultdict(list)
        self.num_positions = 0

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_version.values())

    @property
    def versions(self) -> list[int]:
        return sorted(v for v, entries in self._by_version.items() if entries)

    def add(self, entries: list[BufferedRollout]) -> None:
        """Store `entries`, then evict the oldest versions' oldest rollouts beyond `max_positions`."""
        for entry in entries:
            self._by_version[entry.policy_version].append(entry)
            self.num_positions += entry.num_positions
        while self.num_positions > self.config.max_positions:
            version = self.versions[0]
            oldest = self._by_version[version]
            self.num_positions -= oldest.pop(0).num_positions
            if not oldest:
                del self._by_version[version]

    def entries(self) -> list[BufferedRollout]:
        return [e for v in self.versions for e in self._by_version[v]]

    def position_weights(self, entry: BufferedRollout) -> torch.Tensor:
        """[T] weight of each position: `rejected_weight` where a draft was rejected, else 1."""
        return 1.0 + (self.config.rejected_weight - 1.0) * entry.rejected.float()

    def sample(self, num_rollouts: int, generator: torch.Generator | None = None) -> DraftBatch:
        """Draw `num_rollouts` rollouts (with replacement) into a batch whose weights sum to 1 per rollout."""
        return self.sample_batches(1, num_rollouts, generator)[0]

    def sample_batches(self, num_batches: int, batch_size: int,
                       generator: torch.Generator | None = None) -> list[DraftBatch]:
        """`num_batches` batches of `batch_size` rollouts, drawn together as `sample` draws one, then
        grouped by length: a batch is padded to its longest context, and rollouts of a GRPO step range
        from ~15 to ~140 tokens, so random batches of 8 were half padding (measured on the demo: mean
        context 32, mean padded 65). Every rollout is drawn with the same probability as by `sample`;
        only which batch it lands in depends on its length. The batches come in random order."""
        entries = self.entries()
        if not entries:
            raise ValueError("cannot sample from an empty DraftBuffer")
        newest = max(e.policy_version for e in entries)
        weights = [self.position_weights(e) for e in entries]
        totals = torch.stack([w.sum() for w in weights])  # [N]
        recency = torch.tensor([self.config.recency_decay ** (newest - e.policy_version) for e in entries])
        picks = torch.multinomial(recency * totals, num_batches * batch_size, replacement=True, generator=generator)
        picked = sorted(picks.tolist(), key=lambda i: entries[i].token_ids.shape[0])
        order = torch.randperm(num_batches, generator=generator).tolist()
        return [collate([entries[i] for i in chunk], [weights[i] / totals[i] for i in chunk])
                for chunk in (picked[b * batch_size:(b + 1) * batch_size] for b in order)]

    def state_dict(self) -> dict:
        return {
            "config": asdict(self.config),
            "entries": [dict(vars(e)) for e in self.entries()],
        }

    def load_state_dict(self, state: dict) -> None:
        self.config = BufferConfig(**state["config"])
        self._by_version.clear()
        self.num_positions = 0
        self.add([BufferedRollout(**e) for e in state["entries"]])

    def save(self, path: str | os.PathLike) -> None:
        """Atomic (`checkpoint.save_checkpoint`): a crash mid-save leaves the previous file whole."""
        save_checkpoint(self.state_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> DraftBuffer:
        """A buffer from `save`; an empty, truncated or foreign file raises a `ValueError` naming `path`."""
        buffer = cls()
        buffer.load_state_dict(load_checkpoint(path, ("config", "entries")))
        return buffer
