"""The tokenizer saved with a model or a drafter checkpoint, when there is one: what vocabulary checks compare."""

from __future__ import annotations

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def load_tokenizer(path: str | None) -> PreTrainedTokenizerBase | None:
    """The tokenizer saved at `path` (a folder or a locally cached hub id), or None if there is none."""
    if not path:
        return None
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):  # no tokenizer files there
        return None
