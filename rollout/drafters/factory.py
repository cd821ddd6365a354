"""make_drafter: the engine's `Drafter` from what `SpecEngine` was given and what `EngineConfig.drafters` lists.

Each listed kind is built by its spec (`registry`): "model" from the drafter LM passed to `SpecEngine`; a head kind
from the head passed as the drafter or, without one, a fresh head shaped after the target (the learner trains its
first version from the first rollouts); "layer_skip" and "suffix" from nothing of their own. A model-free kind
("suffix") with one that runs a model is a `suffix_or_model.SuffixOrModelDrafter`. `drafter_memory` says what that
drafter will need before it is built; `initial_draft_vocab` is its first draft vocabulary, the one the engine, the
local backend and the Ray learner all start from.
"""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel

from ..config import EngineConfig
from ..models.runner import ModelRunner
from .draft_vocab import DraftVocab, initial_ids
from .protocol import Drafter, DrafterMemory
from .registry import DRAFTERS, DrafterSpec, kind_of
from .suffix_or_model import SuffixOrModelDrafter

# The weights SpecEngine wraps as a registered kind's drafter (a drafter LM, a head: `registry.kind_of`); anything
# else non-None is a `Drafter`, used as given.
DrafterWeights = nn.Module


def make_drafter(drafter: DrafterWeights | Drafter | None, config: EngineConfig, target: ModelRunner) -> Drafter | None:
    """The engine's drafter: a `Drafter` object as given; else what `config.drafters` lists, built from
    `drafter` (None: what `drafter` is — an LM "model", a head its kind — else no drafter)."""
    given = kind_of(drafter)
    if drafter is not None and given is None:
        if config.drafters is not None:
            raise ValueError(f"drafters={config.drafters!r} is invalid with a Drafter object passed to "
                             "SpecEngine (it is used as given): leave drafters None")
        return drafter
    kinds = config.drafters if config.drafters is not None else (() if given is None else (given,))
    for kind in kinds:
        spec = DRAFTERS[kind]
        if spec.weights is not None and spec.fresh is None and given != kind:
            needs = "a drafter LM" if issubclass(spec.weights, PreTrainedModel) else f"a {spec.weights.__name__}"
            raise ValueError(f"drafters={kinds!r} is invalid: {kind!r} needs {needs} passed to SpecEngine")
    if given is not None and given not in kinds:
        raise ValueError(f"drafters={kinds!r} is invalid with a {type(drafter).__name__} passed to SpecEngine "
                         f"(it drafts as {given!r}): list {given!r}")
    built = {spec.model_free: spec.build(drafter if given == spec.kind else None, config, target)
             for spec in map(DRAFTERS.__getitem__, kinds)}  # config allows one of each
    if len(built) == 2:
        return SuffixOrModelDrafter(built[True], built[False], target.vocab_size)
    return next(iter(built.values()), None)


def drafter_memory(drafter: DrafterWeights | Drafter | None, config: EngineConfig, target: PreTrainedModel
                   ) -> DrafterMemory:
    """What the drafter `make_drafter` will build needs, before it is built (its kind that runs a model's)."""
    spec = _model_spec(config, drafter)
    return DrafterMemory() if spec is None else spec.memory(drafter, config, target)


def initial_draft_vocab(config: EngineConfig, vocab_size: int, target_config, drafter: object = None
                        ) -> DraftVocab | None:
    """`config.draft_vocab` before any rollout was counted (None: the whole vocabulary): the subset `drafter`'s
    weights were trained over if they carry one, else the first ids and the EOS ids (`draft_vocab.initial_ids`); the
    online learner publishes subsets counted from rollouts. A ValueError where the drafter cannot take one."""
    size = config.draft_vocab
    if size is None:
        return None
    if size > vocab_size:
        raise ValueError(f"draft_vocab={size} is invalid: an int in [1, {vocab_size}] (the target's vocabulary)")
    kinds = _kinds(config, drafter)
    if not any(kind in DRAFTERS and DRAFTERS[kind].draft_vocab for kind in kinds):
        able = tuple(kind for kind, spec in DRAFTERS.items() if spec.draft_vocab)
        raise ValueError(f"draft_vocab={size} is invalid with drafters {kinds}: it needs a drafter with an LM "
                         f"head, one of {able}")
    return DraftVocab(initial_ids(size, vocab_size, target_config, drafter), vocab_size)


def _kinds(config: EngineConfig, drafter: object) -> tuple[str, ...]:
    """The kinds the engine drafts with: those listed, else the given weights' kind, or a `Drafter` object's names."""
    if config.drafters is not None:
        return config.drafters
    given = kind_of(drafter)
    if given is not None:
        return (given,)
    return tuple(getattr(drafter, "names", ()))


def _model_spec(config: EngineConfig, drafter: object) -> DrafterSpec | None:
    kinds = config.drafters if config.drafters is not None else (() if kind_of(drafter) is None else
                                                                 (kind_of(drafter),))
    return next((DRAFTERS[kind] for kind in kinds if not DRAFTERS[kind].model_free), None)
