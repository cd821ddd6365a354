"""specroll's own head files: a head's weights and the draft vocabulary it was trained over, each its own entry.

    save_head_file("eagle.pt", head, draft_vocab=ids)     # `specroll distill`
    saved = read_head_file("eagle.pt")                     # `model_source.load_drafter` (`models.head`)
    head.load_state_dict(saved.weights); carry(head, saved.draft_vocab)

A file is `torch.save({"weights": state_dict, "draft_vocab": ids or None})`. A plain `state_dict` file (a head saved
with `torch.save(head.state_dict())`, as the demo's and older `specroll distill` runs', whose draft vocabulary rode
in it under "draft_vocab.ids") is read too: this reader is the one place that knows that older layout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

OLD_VOCAB_ENTRY = "draft_vocab.ids"  # where files written before the two-entry layout kept the draft vocabulary


@dataclass(frozen=True)
class HeadFile:
    weights: dict[str, torch.Tensor]
    draft_vocab: torch.Tensor | None = None  # sorted target ids the head was trained over (None: the whole vocabulary)


def save_head_file(path: str | os.PathLike, head: nn.Module, draft_vocab: torch.Tensor | None = None) -> None:
    """Write `head`'s weights and `draft_vocab` (None: trained over the whole vocabulary) to `path`."""
    ids = None if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long).cpu()
    torch.save({"weights": head.state_dict(), "draft_vocab": ids}, path)


def read_head_file(path: str | os.PathLike) -> HeadFile:
    """The head file at `path` (either layout, module doc)."""
    state = torch.load(path, weights_only=True)
    if set(state) == {"weights", "draft_vocab"} and isinstance(state["weights"], dict):
        return HeadFile(state["weights"], state["draft_vocab"])
    ids = state.get(OLD_VOCAB_ENTRY)
    return HeadFile({name: tensor for name, tensor in state.items() if name != OLD_VOCAB_ENTRY}, ids)
