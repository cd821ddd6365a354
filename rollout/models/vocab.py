"""Drafter/target vocabulary compatibility.

Speculative sampling compares p and q token by token, so id i must mean the same string to both
models. With tokenizers we compare the vocabularies themselves (token → id); embedding rows past a
tokenizer's vocabulary (padding to a multiple of 64, say) are fine. Without tokenizers we can only
compare sizes, and refuse a mismatch rather than guess.
"""

from __future__ import annotations

from transformers import PreTrainedModel


def check_vocab_compatible(target: PreTrainedModel, drafter: PreTrainedModel, target_tokenizer=None,
                           drafter_tokenizer=None) -> None:
    """Raise `ValueError` if the drafter's token ids cannot be used as the target's."""
    if (target_tokenizer is None) != (drafter_tokenizer is None):
        raise ValueError(
            "pass both target_tokenizer and drafter_tokenizer (or neither) so the vocabularies can be compared"
        )
    if target_tokenizer is not None:
        t_vocab, d_vocab = target_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
        mismatched = sorted(tok for tok, i in d_vocab.items() if t_vocab.get(tok) != i)
        missing = sorted(set(t_vocab) - set(d_vocab))
        if mismatched or missing:
            raise ValueError(
                "drafter vocabulary cannot be mapped onto the target's: "
                f"{len(mismatched)} drafter tokens have another id or are absent in the target "
                f"(e.g. {mismatched[:5]}), {len(missing)} target tokens are absent in the drafter "
                f"(e.g. {missing[:5]}); a drafter must share the target's tokenizer"
            )
        return
    t_size = target.get_output_embeddings().weight.shape[0]
    d_size = drafter.get_output_embeddings().weight.shape[0]
    if t_size != d_size:
        raise ValueError(
            f"drafter vocab size {d_size} != target vocab size {t_size}; pass target_tokenizer and "
            "drafter_tokenizer so the vocabularies themselves can be compared (padded embedding rows are fine)"
        )
