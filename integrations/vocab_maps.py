"""Draft-vocabulary maps in the public checkpoint layouts: `d2t` and `t2d` ↔ the sorted target ids a head drafts over.

    tensors.update(vocab_maps(ids, vocab_size))          # writing: {} for the whole vocabulary
    ids = draft_ids(d2t, t2d, draft_vocab_size, vocab_size)   # reading: checked

As speculators writes them (`src/speculators/model.py`, `train/vocab_mapping.py`) and vLLM reads them: `d2t` [N]
int64 offsets (draft row i drafts target id i + d2t[i]), `t2d` [V] bool (the target ids drafted). A head over the
whole vocabulary carries neither.
"""

from __future__ import annotations

import torch


def vocab_maps(ids: torch.Tensor | None, vocab_size: int) -> dict[str, torch.Tensor]:
    """`d2t` and `t2d` for the sorted target `ids` [N] a head drafts over; {} when it drafts over all `vocab_size`."""
    if ids is None or ids.numel() == vocab_size:
        return {}
    ids = torch.as_tensor(ids, dtype=torch.long).cpu()
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": ids - torch.arange(ids.numel()), "t2d": t2d}


def draft_ids(d2t: torch.Tensor | None, t2d: torch.Tensor | None, size: int, vocab_size: int) -> torch.Tensor:
    """The target ids [size] of a checkpoint's draft rows (from `d2t`, checked against `t2d`); every id without a
    map, which `size` must then cover. `ValueError` naming the map and both values otherwise."""
    if d2t is None:
        if size != vocab_size:
            raise ValueError(f"draft_vocab_size is {size} with no d2t map: a head without one drafts the target's "
                             f"whole vocabulary ({vocab_size})")
        return torch.arange(vocab_size)
    if d2t.shape[0] != size:
        raise ValueError(f"d2t has {d2t.shape[0]} entries, draft_vocab_size says {size}")
    ids = torch.arange(size) + d2t.long()
    if not bool((ids[1:] > ids[:-1]).all()) or int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise ValueError(f"d2t maps draft ids onto target ids [{int(ids.min())}, {int(ids.max())}], not increasing "
                         f"within the target's vocabulary [0, {vocab_size})")
    if t2d is not None:
        if t2d.shape[0] != vocab_size:
            raise ValueError(f"t2d has {t2d.shape[0]} entries, the target's vocabulary {vocab_size}")
        if not torch.equal(t2d.bool().nonzero()[:, 0], ids):
            raise ValueError("t2d marks other target ids than d2t maps to: the checkpoint's vocabulary maps disagree")
    return ids
