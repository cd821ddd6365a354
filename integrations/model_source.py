"""Where the rollout engines load the models from (`ModelPaths`), and the target's and drafter's
tokenizers for the engine's vocabulary check, when they can be found."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from specroll.rollout.config import require


@dataclass
class ModelPaths:
    """`save_pretrained` directories (or hub ids already in the local cache) loaded inside the actors.

    The tokenizers (by default looked for in the model folders themselves) let the engine compare
    the two vocabularies token by token — needed when the embedding tables are padded to different
    sizes (e.g. Qwen2.5-7B's 152064 rows vs 0.5B's 151936 over the same tokenizer).
    """

    target: str = ""
    drafter: str | None = None
    target_tokenizer: str | None = None
    drafter_tokenizer: str | None = None

    def __post_init__(self) -> None:
        require(bool(self.target), "models.target", self.target, "a model path")


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
