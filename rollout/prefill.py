"""Prefill: admitted requests' prompts into the target cache, siblings sharing their prompt's full blocks.

The target cache holds every token of a row but the last, so a prompt of P tokens feeds P - 1. With a
paged cache (`models.paged`) a request whose prompt a live row (or an earlier request of the same
admission) already holds takes that row's first (P - 1) // block_size blocks as they are and feeds only
the rest: the holders go first, in one ragged forward, then the sharers, in a second. The hidden states a
feature drafter reads are copied from the holder for the shared positions. A dense cache feeds every
prompt whole in one forward.
"""

from __future__ import annotations

import torch

from .core.batch import RowBuffers
from .core.request import Request
from .models.cache import RaggedKVCache
from .models.paged import PagedKVCache
from .models.rows import RowIds
from .models.runner import ModelRunner


def prefill_target(target: ModelRunner, rows: RowBuffers, admitted: list[Request], live: list[Request | None],
                   reserve_tokens: list[int]) -> tuple[RowIds, torch.Tensor]:
    """Reset the admitted requests' slots and feed their prompts but the last token; returns their slots and
    the count fed per request in full [k] (what the drafter's prefill feeds). `live`: the scheduler's rows;
    `reserve_tokens[i]`: the tokens admitted request i reserved (a paged cache)."""
    ids, counts = [req.slot for req in admitted], [len(req.prompt_ids) - 1 for req in admitted]
    packed = torch.tensor(ids + counts, dtype=torch.long, device=rows.tokens.device)  # one copy: [2k]
    slots, count = RowIds(packed[: len(ids)], ids), packed[len(ids) :]
    cache = target.cache
    cache.reset_rows(slots)
    sharing = {}
    if isinstance(cache, PagedKVCache):
        for req, tokens in zip(admitted, reserve_tokens):
            cache.assign(req.slot, tokens)
        sharing = _holders(admitted, live, cache.block_size)
    first = [i for i, req in enumerate(admitted) if req.slot not in sharing]
    _extend(target, rows, [admitted[i] for i in first], [0] * len(first))
    if sharing:
        followers = [req for req in admitted if req.slot in sharing]
        shared = []
        for req in followers:
            holder, blocks = sharing[req.slot]
            cache.share_prefix(req.slot, holder, blocks)
            shared.append(blocks * cache.block_size)
            if rows.hidden is not None:
                rows.hidden[req.slot, : shared[-1]] = rows.hidden[holder, : shared[-1]]
        _extend(target, rows, followers, shared)
    return slots, count


def _holders(admitted: list[Request], live: list[Request | None], block_size: int) -> dict[int, tuple[int, int]]:
    """slot → (holder slot, full blocks to share) for each admitted request whose prompt another row holds."""
    admitted_slots = {req.slot for req in admitted}
    holders = {tuple(req.prompt_ids): req.slot for req in live if req is not None and req.slot not in admitted_slots}
    out = {}
    for req in admitted:
        key, blocks = tuple(req.prompt_ids), (len(req.prompt_ids) - 1) // block_size
        holder = holders.setdefault(key, req.slot)
        if holder != req.slot and blocks:
            out[req.slot] = (holder, blocks)
    return out


def _extend(target: ModelRunner, rows: RowBuffers, requests: list[Request], shared: list[int]) -> None:
    """Feed each request its prompt but the last token from `shared[i]` on (its cache holds those already)."""
    counts = [len(req.prompt_ids) - 1 - s for req, s in zip(requests, shared)]
    if not requests or max(counts + shared) == 0:
        return
    ids = [req.slot for req in requests]
    packed = torch.tensor(ids + shared + counts, dtype=torch.long, device=rows.tokens.device)  # one copy: [3k]
    k = len(ids)
    slots = RowIds(packed[:k], ids)
    if any(shared):
        target.cache.set_lens(slots, packed[k : 2 * k], shared)
    if max(counts) > 0:
        target.extend(slots, rows.tokens[slots.index], packed[2 * k :], rows.hidden, host_count=counts)


def reserved_tokens(prompt_len: int, max_new_tokens: int, step_drafts: int) -> int:
    """The most tokens a request's row can hold in the target cache: its prompt and budget, a step of drafts
    (`EngineConfig.max_step_drafts`: a tree's nodes)."""
    return prompt_len + max_new_tokens + step_drafts


def check_blocks(cache: RaggedKVCache, tokens: list[int]) -> None:
    """A paged cache must hold every request alone (else it would wait for ever): `ValueError` if one cannot."""
    if isinstance(cache, PagedKVCache):
        cache.check_fits(tokens)


def admits(cache: RaggedKVCache, tokens: int) -> bool:
    """Whether `cache` can take a request of up to `tokens` tokens now (a paged cache: its blocks are free, and
    reserved)."""
    return not isinstance(cache, PagedKVCache) or cache.try_reserve(tokens)
