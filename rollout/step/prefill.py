"""The prefill step: admitted requests' prompts into both caches, siblings sharing their prompt's full blocks.

The target cache holds every token of a row but the last, so a prompt of P tokens feeds P - 1. Where the cache
shares blocks (paged, `models.paged`: `RaggedKVCache.shareable_blocks`) a request whose prompt a live row (or an
earlier request of the same admission) already holds takes that row's first (P - 1) // block_size blocks as they
are and feeds only the rest: the holders go first, in one ragged forward, then the sharers, in a second. The hidden
states a feature drafter reads are copied from the holder for the shared positions. A dense cache shares nothing
and feeds every prompt whole in one forward. Then the drafter's own prefill (`Drafter.prefill`).
"""

from __future__ import annotations

import torch

from ..core.batch import RowBuffers
from ..core.request import Request
from ..drafters.protocol import Drafter
from ..models.rows import RowIds
from ..models.runner import ModelRunner


class PrefillStep:
    """The prefill of one engine (module docstring); `step_drafts`: the most drafts one step verifies per row
    (`EngineConfig.max_step_drafts`), which every request reserves room for."""

    def __init__(self, target: ModelRunner, drafter: Drafter | None, step_drafts: int):
        self.target, self.drafter, self.step_drafts = target, drafter, step_drafts

    def reserved_tokens(self, prompt_len: int, max_new_tokens: int) -> int:
        """The most tokens a request's row can hold in the target cache: its prompt and budget, a step of drafts."""
        return prompt_len + max_new_tokens + self.step_drafts

    def run(self, rows: RowBuffers, admitted: list[Request], live: list[Request | None], drafts: bool) -> None:
        """Load the admitted requests into their slots and fill both caches with all but the last token. `live`:
        the scheduler's rows; `drafts`: the drafter feeds the prompts now (else it catches up lazily, if ever)."""
        for req in admitted:
            rows.load(req.slot, req.prompt_ids, req.max_new_tokens, req.key)
        slots, count = self._prefill_target(rows, admitted, live)
        if self.drafter:
            self.drafter.prefill(slots, rows, count if drafts else torch.zeros_like(count))

    def _prefill_target(self, rows: RowBuffers, admitted: list[Request], live: list[Request | None]
                        ) -> tuple[RowIds, torch.Tensor]:
        """Reset the admitted requests' slots and feed their prompts but the last token; returns their slots and
        the count fed per request in full [k] (what the drafter's prefill feeds)."""
        ids, counts = [req.slot for req in admitted], [len(req.prompt_ids) - 1 for req in admitted]
        packed = torch.tensor(ids + counts, dtype=torch.long, device=rows.tokens.device)  # one copy: [2k]
        slots, count = RowIds(packed[: len(ids)], ids), packed[len(ids) :]
        cache = self.target.cache
        cache.reset_rows(slots)
        for req in admitted:
            cache.assign(req.slot, self.reserved_tokens(len(req.prompt_ids), req.max_new_tokens))
        sharing = self._holders(admitted, live)
        first = [req for req in admitted if req.slot not in sharing]
        self._extend(rows, first, [0] * len(first))
        if sharing:
            followers = [req for req in admitted if req.slot in sharing]
            shared = [cache.share_prefix(req.slot, *sharing[req.slot]) for req in followers]
            if rows.hidden is not None:
                for req, tokens in zip(followers, shared):
                    rows.hidden[req.slot, :tokens] = rows.hidden[sharing[req.slot][0], :tokens]
            self._extend(rows, followers, shared)
        return slots, count

    def _holders(self, admitted: list[Request], live: list[Request | None]) -> dict[int, tuple[int, int]]:
        """slot → (holder slot, full blocks to share) for each admitted request whose prompt another row holds."""
        admitted_slots = {req.slot for req in admitted}
        holders = {tuple(req.prompt_ids): req.slot for req in live
                   if req is not None and req.slot not in admitted_slots}
        out = {}
        for req in admitted:
            key, blocks = tuple(req.prompt_ids), self.target.cache.shareable_blocks(len(req.prompt_ids))
            holder = holders.setdefault(key, req.slot)
            if holder != req.slot and blocks:
                out[req.slot] = (holder, blocks)
        return out

    def _extend(self, rows: RowBuffers, requests: list[Request], shared: list[int]) -> None:
        """Feed each request its prompt but the last token from `shared[i]` on (its cache holds those already)."""
        counts = [len(req.prompt_ids) - 1 - s for req, s in zip(requests, shared)]
        if not requests or max(counts + shared) == 0:
            return
        ids = [req.slot for req in requests]
        packed = torch.tensor(ids + shared + counts, dtype=torch.long, device=rows.tokens.device)  # one copy: [3k]
        k = len(ids)
        slots = RowIds(packed[:k], ids)
        if any(shared):
            self.target.cache.set_lens(slots, packed[k : 2 * k], shared)
        if max(counts) > 0:
            self.target.extend(slots, rows.tokens[slots.index], packed[2 * k :], rows.hidden, host_count=counts)
