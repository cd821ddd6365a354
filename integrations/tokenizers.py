"""The target's and drafter's tokenizers, for the engine's vocabulary check, when they can be found."""

from __future__ import annotations

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from .config import ModelPaths


def load_tokenizer(path: str | None) -> PreTrainedTokenizerBase | None:
    """The tokenizer saved at `path` (a folder or a locally cached hub id), or None if there is none."""
    if not path:
        return None
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):  # no tokenizer files there
        return None


def tokenizer_pair(models: ModelPaths) -> tuple[PreTrainedTokenizerBase | None, PreTrainedTokenizerBase | None]:
    """(target, drafter) tokenizers if both are found, else (None, None): the engine then compares sizes."""
    if not models.drafter:
        return None, None
    target = load_tokenizer(models.target_tokenizer or models.target)
    drafter = load_tokenizer(models.drafter_tokenizer or models.drafter)
    return (target, drafter) if target is not None and drafter is not None else (None, None)
