"""HoldoutSet: a stride of prompt groups held out from the learner's training, kept across policy versions.

The learner decides on these positions (publish gate, watchdog), so they are never trained on while
held out. A group is a prompt's samples at one policy version, keyed `(policy_version, prompt ids)`;
whole groups are held out together, because a sibling of a training rollout shares its prompt and
much of its text. Every 1/f-th group is held out, starting with the first (an exact fraction f over
the run). Groups older than `min_version` (whose recency weight in the comparisons no longer counts)
and, past `max_positions`, the oldest groups leave the set, whole, to be trained on: scoring them
would cost the learner's budget and move no decision.
"""

from __future__ import annotations

import math

from ..buffer import BufferEntry

GroupKey = tuple[int, tuple[int, ...]]  # (policy version, prompt token ids)


class HoldoutSet:
    def __init__(self, fraction: float, max_positions: int):
        self.fraction = fraction
        self.max_positions = max_positions
        self.entries: list[BufferEntry] = []
        self.keys: list[GroupKey] = []  # the group of each entry
        self.num_groups_seen = 0
        self._is_held_out: dict[GroupKey, bool] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def offer(self, entry: BufferEntry, key: GroupKey) -> bool:
        """Keep `entry` if its group is held out (True), else leave it to the caller to train on (False)."""
        if key not in self._is_held_out:
            i, f = self.num_groups_seen, self.fraction
            self.num_groups_seen += 1
            self._is_held_out[key] = math.floor((i + 1) * f + 1 - f + 1e-9) > math.floor(i * f + 1 - f + 1e-9)
        if self._is_held_out[key]:
            self.entries.append(entry)
            self.keys.append(key)
        return self._is_held_out[key]

    def trim(self, min_version: int | None = None) -> list[BufferEntry]:
        """Drop groups of policy versions below `min_version`, then the oldest whole groups beyond
        `max_positions`; returns the dropped entries."""
        dropped = []
        while self.keys and (sum(e.num_positions for e in self.entries) > self.max_positions
                             or (min_version is not None and self.keys[0][0] < min_version)):
            oldest = self.keys[0]
            while self.keys and self.keys[0] == oldest:
                self.keys.pop(0)
                dropped.append(self.entries.pop(0))
        return dropped

    def state_dict(self) -> dict:
        return {"entries": [dict(vars(e)) for e in self.entries], "keys": [[v, list(p)] for v, p in self.keys],
                "num_groups_seen": self.num_groups_seen,
                # Every group seen and where it went (a group met again at its version goes where it went first).
                "decided": [[v, list(p), held] for (v, p), held in self._is_held_out.items()]}

    def load_state_dict(self, state: dict, entry_type: type) -> None:
        """Take back `state_dict()`, its entries rebuilt as `entry_type` (the buffer's)."""
        self.entries = [entry_type(**e) for e in state["entries"]]
        self.keys = [(int(v), tuple(p)) for v, p in state["keys"]]
        self.num_groups_seen = state["num_groups_seen"]
        decided = state.get("decided")  # absent in a state saved before it was kept: the held-out groups only
        self._is_held_out = dict.fromkeys(self.keys, True) if decided is None else {
            (int(v), tuple(p)): bool(held) for v, p, held in decided}
