"""ReplayBuffer: the online learner's bounded store of what verification revealed, keyed by policy version.

One buffer for both drafter families. An entry is one rollout as its family keeps it — the drafter LM's
`lm.data.BufferedRollout` (context ids, the target's top-k p at each completion position, which drafts were
rejected), a head's `heads.data.FeatureSequence` (the same, and the policy's hidden states) — and a family's
buffer (`lm.data.DraftBuffer`, `heads.data.FeatureBuffer`) names its `entry_type` and the `collate` that pads
drawn entries into its batch. What the buffer keeps and how it draws is the same for both:

- The policy moves every RL step, so sampling favours the newest versions: a rollout of version v weighs
  `recency_decay ** (newest − v)`.
- Within a rollout, positions where a draft was rejected weigh `rejected_weight` (others 1): that is where
  the drafter and the target disagreed. An entry never drafted (`rejected` None: an offline sample) weighs
  1 everywhere.
- A rollout is drawn with probability ∝ recency × W (W = the sum of its position weights) and its positions
  are weighted w_t / W in the loss, so in expectation each position counts ∝ recency × w_t, whatever its
  rollout's length.
- When full (`max_positions` completion positions), the oldest rollouts of the oldest version go first:
  a held-out group handed back to training (`HoldoutSet.trim`) leaves by its version, not by when it came.

`save` / `load` round-trip the contents so a run can resume (`state/checkpoint.py`: written atomically, read back
checked).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, ClassVar, Protocol

import torch

from specroll.rollout import RolloutSignals

from .learner_config import BufferConfig
from .state.checkpoint import load_checkpoint, save_checkpoint


class BufferEntry(Protocol):
    """What the buffer, the held-out set and the learner read of an entry (a dataclass of tensors and ints)."""

    token_ids: torch.Tensor  # [P + T] int64, prompt then completion
    prompt_len: int  # P
    topk_ids: torch.Tensor  # [T, k] int64, target ids of p's top-k at each completion position
    topk_probs: torch.Tensor  # [T, k] fp32, p at those ids
    rejected: torch.Tensor | None  # [T] bool, a draft was proposed here and rejected; None: never drafted
    policy_version: int

    @property
    def num_positions(self) -> int:  # T
        ...


def rejected_drafts(signals: RolloutSignals) -> torch.Tensor:
    """[T] bool: a draft was proposed at the position (`draft_ids` >= 0) and not `accepted`."""
    return (signals.draft_ids >= 0).cpu() & ~signals.accepted.cpu()


class ReplayBuffer:
    """Bounded store of a drafter family's entries; `sample_batches` draws recency- and rejection-weighted
    batches. A family's subclass sets `entry_type` (rebuilt from its fields on `load`) and `collate`."""

    entry_type: ClassVar[type]
    collate: ClassVar[Callable[[list[Any], list[torch.Tensor]], Any]]  # (entries, position weights) -> batch

    def __init__(self, config: BufferConfig | None = None):
        self.config = config or BufferConfig()
        self._by_version: dict[int, list[BufferEntry]] = defaultdict(list)
        self.num_positions = 0

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_version.values())

    @property
    def versions(self) -> list[int]:
        return sorted(v for v, entries in self._by_version.items() if entries)

    def add(self, entries: list[BufferEntry]) -> None:
        """Store `entries`, then evict the oldest versions' oldest entries beyond `max_positions`."""
        for entry in entries:
            self._by_version[entry.policy_version].append(entry)
            self.num_positions += entry.num_positions
        while self.num_positions > self.config.max_positions:
            version = self.versions[0]
            oldest = self._by_version[version]
            self.num_positions -= oldest.pop(0).num_positions
            if not oldest:
                del self._by_version[version]

    def entries(self) -> list[BufferEntry]:
        return [e for v in self.versions for e in self._by_version[v]]

    def position_weights(self, entry: BufferEntry) -> torch.Tensor:
        """[T] weight of each completion position: `rejected_weight` where a draft was rejected, else 1."""
        if entry.rejected is None:
            return torch.ones(entry.num_positions)
        return 1.0 + (self.config.rejected_weight - 1.0) * entry.rejected.float()

    def sample(self, num_entries: int, generator: torch.Generator | None = None) -> Any:
        """Draw `num_entries` entries (with replacement) into a batch whose weights sum to 1 per entry."""
        return self.sample_batches(1, num_entries, generator)[0]

    def sample_batches(self, num_batches: int, batch_size: int, generator: torch.Generator | None = None) -> list[Any]:
        """`num_batches` batches of `batch_size` entries, drawn together as `sample` draws one, then
        grouped by length: a batch is padded to its longest context, and rollouts of a GRPO step range
        from ~15 to ~140 tokens, so random batches of 8 were half padding (measured on the demo: mean
        context 32, mean padded 65). Every entry is drawn with the same probability as by `sample`;
        only which batch it lands in depends on its length. The batches come in random order."""
        entries = self.entries()
        if not entries:
            raise ValueError(f"cannot sample from an empty {type(self).__name__}: add rollouts first")
        newest = max(e.policy_version for e in entries)
        weights = [self.position_weights(e) for e in entries]
        totals = torch.stack([w.sum() for w in weights])  # [N]
        recency = torch.tensor([self.config.recency_decay ** (newest - e.policy_version) for e in entries])
        picks = torch.multinomial(recency * totals, num_batches * batch_size, replacement=True, generator=generator)
        picked = sorted(picks.tolist(), key=lambda i: entries[i].token_ids.shape[0])
        order = torch.randperm(num_batches, generator=generator).tolist()
        return [self.collate([entries[i] for i in chunk], [weights[i] / totals[i] for i in chunk])
                for chunk in (picked[b * batch_size:(b + 1) * batch_size] for b in order)]

    def state_dict(self) -> dict:
        return {"config": asdict(self.config), "entries": [dict(vars(e)) for e in self.entries()]}

    def load_state_dict(self, state: dict) -> None:
        self.config = BufferConfig(**state["config"])
        self._by_version.clear()
        self.num_positions = 0
        self.add([self.entry_type(**e) for e in state["entries"]])

    def save(self, path: str | os.PathLike) -> None:
        """Atomic (`checkpoint.save_checkpoint`): a crash mid-save leaves the previous file whole."""
        save_checkpoint(self.state_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ReplayBuffer:
        """A buffer from `save`; an empty, truncated or foreign file raises a `ValueError` naming `path`."""
        buffer = cls()
        buffer.load_state_dict(load_checkpoint(path, ("config", "entries")))
        return buffer
