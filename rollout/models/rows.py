"""Which rows of the batch a forward touches, as the device indexes them and as the host knows them.

Live rows are a prefix of the slots, so most forwards take a `slice`. A forward over some rows only
(new requests' slots at prefill, the rows one drafter serves) takes a `RowIds`: the index tensor the
device gathers with and the same ids as a host list, built together from the host list, so that the
cache's host bookkeeping never reads the index back from the device. A bare index tensor is accepted
too (tests, tools); its ids then cost one device→host copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowIds:
    """Some slots of the batch: `index` [k] int64 on the device, `ids` the same on the host."""

    index: torch.Tensor
    ids: list[int]

    @classmethod
    def of(cls, ids: list[int], device: torch.device) -> RowIds:
        """From host ids (one host→device copy)."""
        return cls(torch.tensor(ids, dtype=torch.long, device=device), list(ids))


Rows = slice | RowIds | torch.Tensor


def device_index(rows: Rows) -> slice | torch.Tensor:
    """What indexes a [B, ...] buffer at `rows`."""
    return rows.index if isinstance(rows, RowIds) else rows


def host_ids(rows: Rows, batch: int) -> list[int]:
    """The row ids of `rows` on the host (a bare index tensor is copied: off the hot path only)."""
    if isinstance(rows, slice):
        return list(range(batch))[rows]
    if isinstance(rows, RowIds):
        return rows.ids
    return rows.tolist()


def pick(values: list[int], rows: Rows) -> list[int]:
    """A host list over all slots (`RowBuffers.host_seq_len`, `RaggedKVCache.host_lens`) at `rows`."""
    if isinstance(rows, slice):
        return values[rows]
    return [values[b] for b in host_ids(rows, len(values))]
