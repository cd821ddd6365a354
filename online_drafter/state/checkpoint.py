"""Checkpoint files of the online learner and its buffer: written atomically, read back checked.

    save_checkpoint(learner_state, "learner.pt")
    state = load_checkpoint("learner.pt", required=("version", "published"))

`save_checkpoint` writes to a temporary file in the checkpoint's own folder (so the rename never
crosses file systems), syncs it to disk and `os.replace`s it over the old file: a crash mid-write
leaves the previous checkpoint whole. `load_checkpoint` turns an empty, truncated or foreign file
into a `ValueError` naming the path and what is wrong, where torch raises `EOFError('')` or a
zip-reader error.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> None:
    """`torch.save(state, path)`, all or nothing: `path` holds either the old checkpoint or the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: str | os.PathLike, required: Iterable[str]) -> dict[str, Any]:
    """The state `save_checkpoint` wrote at `path` (tensors only, `weights_only`), holding every `required` key.

    A file that cannot be opened raises its `OSError`; an empty, unreadable or incomplete one a `ValueError`.
    """
    with open(path, "rb") as f:  # opened here: an `OSError` past this point is the file's content
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError(f"checkpoint {path} is empty (0 bytes): never written, or cut short")
        try:
            state = torch.load(f, weights_only=True)
        except (EOFError, OSError, RuntimeError, pickle.UnpicklingError) as err:
            reason = str(err).split(". ")[0]  # torch appends paragraphs of advice to the reason
            raise ValueError(f"checkpoint {path} cannot be read (truncated, or not a checkpoint): {reason}") from err
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path} holds a {type(state).__name__}, not a dict of state")
    missing = sorted(set(required) - set(state))
    if missing:
        raise ValueError(f"checkpoint {path} lacks {missing}: not a checkpoint of this kind")
    return state
