"""The completion index behind `suffix.SuffixDrafter`: per prompt, every completion seen, as hashed n-grams.

Per prompt (keyed by its token ids) a `_Group` holds its completions — each stored as the prompt's last
`max_match` tokens then the completion — and a table from each n-gram (lengths `KEY_LENS`) to the
(completion, position) that followed it, the `candidates` most recent per key. Live rows extend their
completion as they grow; a finished row's completion stays as history. Bounded in tokens: within a
prompt the oldest completions go first (`prompt_history_tokens`; the table is rebuilt once as many
tokens were dropped as are held, so stale entries cost amortised O(1) per token), and overall the least
recently used prompts with no live row (`history_tokens`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ..config import SuffixConfig

KEY_LENS = (16, 8, 4, 2, 1)  # n-gram lengths indexed, longest tried first


@dataclass
class _Group:
    """One prompt's completions: `seqs[id]` = the prompt's last tokens then the completion."""

    seqs: dict[int, list[int]] = field(default_factory=dict)
    table: dict[tuple[int, ...], list[tuple[int, int]]] = field(default_factory=dict)
    tokens: int = 0  # tokens held in `seqs`
    evicted: int = 0  # tokens dropped since the table was last rebuilt
    live: int = 0  # rows generating into this group now


@dataclass
class _Row:
    group: _Group
    seq_id: int
    length: int  # the row's tokens indexed (prompt + completion)


class CompletionIndex:
    """The completions of every prompt seen, and which one each batch slot is writing."""

    def __init__(self, slots: int, config: SuffixConfig):
        self.config = config
        self.rows: list[_Row | None] = [None] * slots
        self.groups: OrderedDict[tuple[int, ...], _Group] = OrderedDict()
        self.tokens = 0  # tokens held, all groups
        self.next_id = 0

    def start(self, slot: int, prompt: list[int]) -> None:
        """Slot `slot` starts a completion of `prompt` (its previous one stays as history)."""
        self.release(slot)
        key = tuple(prompt)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _Group()
        self.groups.move_to_end(key)
        tail = list(key[-self.config.max_match :])
        seq_id, self.next_id = self.next_id, self.next_id + 1
        group.seqs[seq_id] = tail
        group.live += 1
        group.tokens += len(tail)
        self.tokens += len(tail)
        self.rows[slot] = _Row(group, seq_id, len(prompt))
        self._evict_prompts()

    def length(self, slot: int) -> int:
        """The row tokens (prompt + completion) slot `slot` has indexed."""
        return self.rows[slot].length

    def move(self, src: int, dst: int) -> None:
        self.release(dst)
        self.rows[dst], self.rows[src] = self.rows[src], None

    def release(self, slot: int) -> None:
        """The row in `slot` ends: its completion stays in its group as history."""
        row = self.rows[slot]
        if row is not None:
            row.group.live -= 1
            self.rows[slot] = None

    def lookup(self, slot: int, gamma: int) -> tuple[list[int], int]:
        """Up to γ tokens that followed the longest match of the row's end, and the match length (0: none)."""
        row = self.rows[slot]
        seq, group, cfg = row.group.seqs[row.seq_id], row.group, self.config
        for key_len in KEY_LENS:
            if key_len > len(seq) or key_len < cfg.min_match:
                continue
            hits = group.table.get(tuple(seq[-key_len:]))
            if not hits:
                continue
            best, best_len, best_cont = None, 0, 0
            for seq_id, pos in hits:
                other = group.seqs.get(seq_id)
                if other is None:
                    continue
                length = _match_len(seq, other, pos, cfg.max_match)
                cont = min(len(other) - pos, gamma)
                if (length, cont) > (best_len, best_cont):
                    best, best_len, best_cont = (other, pos), length, cont
            if best is not None:
                other, pos = best
                return other[pos : pos + gamma], best_len
        return [], 0

    def lookup_several(self, slot: int, gamma: int, count: int) -> list[tuple[list[int], int]]:
        """Up to `count` continuations (≤ γ tokens each) with distinct first tokens and their match lengths, best
        match first, from every key length (a token tree's suffix branches: siblings and history disagree)."""
        row = self.rows[slot]
        seq, group, cfg = row.group.seqs[row.seq_id], row.group, self.config
        best: dict[int, tuple[int, int, list[int]]] = {}  # first token → (match, continuation length, tokens)
        for key_len in KEY_LENS:
            if key_len > len(seq) or key_len < cfg.min_match:
                continue
            for seq_id, pos in group.table.get(tuple(seq[-key_len:]), ()):
                other = group.seqs.get(seq_id)
                if other is None or pos >= len(other):
                    continue
                found = (_match_len(seq, other, pos, cfg.max_match), min(len(other) - pos, gamma))
                if found > best.get(other[pos], (0, 0))[:2]:
                    best[other[pos]] = (*found, other[pos : pos + gamma])
        ranked = sorted(best.values(), key=lambda hit: hit[:2], reverse=True)[:count]
        return [(tokens, match) for match, _, tokens in ranked]

    def extend(self, slot: int, tokens: list[int]) -> None:
        """Append `tokens` to the completion slot `slot` is writing, indexing each."""
        row = self.rows[slot]
        if not tokens:
            return
        group, seq = row.group, row.group.seqs[row.seq_id]
        table, keep = group.table, self.config.candidates
        for token in tokens:
            pos = len(seq)
            for key_len in KEY_LENS:
                if key_len <= pos:
                    hits = table.setdefault(tuple(seq[pos - key_len :]), [])
                    hits.append((row.seq_id, pos))
                    if len(hits) > keep:
                        del hits[0]
            seq.append(token)
        row.length += len(tokens)
        group.tokens += len(tokens)
        self.tokens += len(tokens)
        if group.tokens > self.config.prompt_history_tokens:
            self._evict_completions(group, row.seq_id)
        if self.tokens > self.config.history_tokens:
            self._evict_prompts()

    def state_dict(self) -> dict:
        """The history (every prompt's completions, least recently used first) as plain data and int64 tensors,
        for a resumed run (`SpecEngine.state_dict`). Rows being written are not part of it: take it between calls."""
        groups = [{"prompt": torch.tensor(key, dtype=torch.int64),
                   "seqs": [(seq_id, torch.tensor(seq, dtype=torch.int64)) for seq_id, seq in group.seqs.items()]}
                  for key, group in self.groups.items()]
        return {"groups": groups, "next_id": self.next_id}

    def load_state_dict(self, state: dict) -> None:
        """Replace the history with a `state_dict()`'s (no row is live after it), its n-gram tables rebuilt: each
        key's candidates are then in completion order, not append order, so drafts may differ from the saved
        run's — never a token. Evicted to this index's bounds."""
        self.rows = [None] * len(self.rows)
        self.groups, self.tokens = OrderedDict(), 0
        for saved in state["groups"]:
            group = _Group(seqs={int(seq_id): seq.tolist() for seq_id, seq in saved["seqs"]})
            group.tokens = sum(len(seq) for seq in group.seqs.values())
            self._rebuild(group)
            self.groups[tuple(saved["prompt"].tolist())] = group
            self.tokens += group.tokens
        self.next_id = int(state["next_id"])
        for group in self.groups.values():
            if group.tokens > self.config.prompt_history_tokens:
                self._evict_completions(group, keep_id=-1)
        self._evict_prompts()

    def _evict_completions(self, group: _Group, keep_id: int) -> None:
        """Drop the group's oldest completions until it fits (never the growing one); rebuild the table
        once as many tokens were dropped as are held (so stale entries cost amortised O(1) per token)."""
        live_ids = {r.seq_id for r in self.rows if r is not None and r.group is group}
        for seq_id in list(group.seqs):
            if group.tokens <= self.config.prompt_history_tokens:
                break
            if seq_id == keep_id or seq_id in live_ids:
                continue
            dropped = len(group.seqs.pop(seq_id))
            group.tokens -= dropped
            group.evicted += dropped
            self.tokens -= dropped
        if group.evicted > group.tokens:
            self._rebuild(group)

    def _rebuild(self, group: _Group) -> None:
        group.table, group.evicted = {}, 0
        keep = self.config.candidates
        for seq_id, seq in group.seqs.items():
            for pos in range(1, len(seq)):
                for key_len in KEY_LENS:
                    if key_len <= pos:
                        hits = group.table.setdefault(tuple(seq[pos - key_len : pos]), [])
                        hits.append((seq_id, pos))
                        if len(hits) > keep:
                            del hits[0]

    def _evict_prompts(self) -> None:
        """Drop least recently used prompts with no live rows until the history fits."""
        while self.tokens > self.config.history_tokens:
            victim = next((key for key, group in self.groups.items() if not group.live), None)
            if victim is None:
                return
            self.tokens -= self.groups.pop(victim).tokens


def _match_len(seq: list[int], other: list[int], pos: int, cap: int) -> int:
    """How many tokens before `pos` in `other` equal the end of `seq` (≤ cap)."""
    length = 0
    while length < cap and length < pos and length < len(seq) and seq[-1 - length] == other[pos - 1 - length]:
        length += 1
    return length
