"""Which vLLM proposer serves which specroll drafter kind, and the `speculative_config` that asks for it.

    model   → "draft_model": the drafter LM, a Hugging Face folder (weights refit in place)
    eagle3  → "eagle3":      an EAGLE-3 head in the speculators layout (`d2t`/`t2d` carry the draft vocabulary)
    block   → "dflash":      a DFlash block head
    suffix  → "ngram":       vLLM's n-gram proposer over the row's own tokens (specroll's suffix index over GRPO
                             siblings has no vLLM proposer: its nearest is prompt lookup, model-free like it)

EAGLE (1), Medusa and layer-skip have no proposer here and are refused at config load, naming the kinds that
have one. For T > 0 the draft tokens are sampled from the drafter's q and q goes to vLLM's rejection rule
(`draft_sample_method="probabilistic"`): with vLLM's default greedy drafts a draft is kept with probability
p(argmax q), not Σ min(p, q) — lossless either way, but it loses most of a good drafter's acceptance at T = 1.
"""

from __future__ import annotations

from typing import Any

from specroll.rollout import EngineConfig
from specroll.rollout.drafters.registry import DRAFTERS

from .gamma import initial_ranges

# kind → vLLM method: each kind's `DrafterSpec.vllm_method` (`rollout.drafters.registry`)
VLLM_METHODS = {kind: spec.vllm_method for kind, spec in DRAFTERS.items() if spec.vllm_method is not None}
PROBABILISTIC_METHODS = ("draft_model", "eagle3")  # vLLM hands their q to the rejection rule
NGRAM_LOOKUP = (1, 4)  # prompt_lookup_min / max of the n-gram proposer (specroll's suffix: min_match .. max_match)


def drafter_kind(config: EngineConfig) -> str | None:
    """The one drafter kind the vLLM engine serves for `config.drafters` (None: plain decoding). ValueError naming
    the kinds vLLM can serve when it cannot serve these."""
    kinds = tuple(config.drafters or ())
    if not kinds:
        return None
    unserved = [k for k in kinds if k not in VLLM_METHODS]
    if unserved or len(kinds) > 1:
        raise ValueError(f"engine.drafters={list(kinds)} is invalid with engine.kind: vllm: it serves one drafter "
                         f"of the kinds {sorted(VLLM_METHODS)} (a vLLM proposer each); {unserved or list(kinds)} "
                         "need specroll's engine (engine.kind: specroll)")
    return kinds[0]


def speculative_config(kind: str | None, drafter_dir: str | None, config: EngineConfig) -> dict[str, Any] | None:
    """vLLM's `speculative_config` for drafting `config.gamma` tokens a step with `kind` (None: no speculation)."""
    if kind is None or config.gamma == 0:
        return None
    method = VLLM_METHODS[kind]
    spec: dict[str, Any] = {"method": method}
    if config.gamma == "auto":  # at most max_gamma; per live batch size `gamma.GammaSchedule` replaces this one
        spec["num_speculative_tokens"] = config.max_gamma
        spec["num_speculative_tokens_per_batch_size"] = initial_ranges(config.max_gamma, config.max_batch_size)
    else:
        spec["num_speculative_tokens"] = int(config.gamma)
    if method == "ngram":
        spec["prompt_lookup_min"] = max(NGRAM_LOOKUP[0], config.suffix.min_match)
        spec["prompt_lookup_max"] = min(max(NGRAM_LOOKUP[1], spec["prompt_lookup_min"]), config.suffix.max_match)
        return spec
    if drafter_dir is None:
        raise ValueError(f"engine.drafters=[{kind!r}] on vLLM needs the drafter's folder (models.drafter or "
                         "models.head), which was not given")
    spec["model"] = drafter_dir
    if method in PROBABILISTIC_METHODS:
        spec["draft_sample_method"] = "probabilistic"
    return spec
