"""The drafter-kind registry: one `DrafterSpec` per kind, registered here, one entry per kind.

    spec = DRAFTERS["eagle3"]          # or spec_for("dflash"): an alias names its kind
    spec.build(head, config, target)   # the engine's `Drafter` (`factory.make_drafter` asks every listed kind)
    spec.vllm_method                   # "eagle3": the vLLM speculative method that can serve it (None: none)

A kind is its drafter module in `drafters/` (`build`, `memory`, and for a head `fresh_head`), its head in `heads/`
(if it has one), its learner family in `specroll.online_drafter` and its checkpoint reader in
`specroll.integrations` — those two live above `rollout` (imports point `integrations` → `online_drafter` →
`rollout`), so a spec names them by import path ("package.module:name"), resolved when they are used (`resolve`).
Everything that asks what a kind is or can do reads its spec: the engine config's validation of `drafters`
(`config.DRAFTER_SPECS`, which this module fills), the factory, the initial draft vocabulary, the online learner
(`make_online_learner`), the model sources (`load_drafter`) and `specroll distill`. Adding a kind is its own files
and one `register` line (below, or a test's own: `tests/test_drafter_registry.py`).

Capabilities: `trees` (it proposes token trees: `protocol.TreeDrafter`), `draft_vocab` (it drafts through an LM
head, so a draft vocabulary can cut it: `EngineConfig.draft_vocab`), `reads_hidden` (it reads the target's hidden
states, and its learner reads the policy's embedding and LM head), `trainable` (it has weights the online learner
trains). `model_free` kinds (the suffix drafter) may join one kind that runs a model (`suffix_or_model`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from transformers import PreTrainedModel

from ..config import DRAFTER_SPECS, EngineConfig
from . import block, eagle, eagle3, layer_skip, medusa, model, recurrent, suffix
from .protocol import Drafter, DrafterMemory

# build(weights or None, config, target runner) → the kind's `Drafter`; memory(weights or None, config, target model)
Build = Callable[[Any, EngineConfig, Any], Drafter]
Memory = Callable[[Any, EngineConfig, PreTrainedModel], DrafterMemory]


def no_memory(weights: object, config: EngineConfig, target: PreTrainedModel) -> DrafterMemory:
    """A drafter with no cache, weights or target states of its own (it reuses the target's, or none)."""
    return DrafterMemory()


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter kind (module doc). `weights`: the class of what `SpecEngine` is given to draft as this kind (a
    head, or `PreTrainedModel` for a drafter LM; None: nothing of its own); `fresh` makes one shaped after the
    target when none is given (None: it must be given, or there is none). `learner`: "module:Class" of its online
    learner (`Class(weights, config)`, or with `reads_hidden` `Class(weights, embed, lm_head, config)`); `reader`:
    "module:function" loading its weights for a run (`function(models, engine_config, target)`). `config_fields`:
    the `EngineConfig` fields that configure it alone."""

    kind: str
    drafter: type
    build: Build
    memory: Memory = no_memory
    weights: type | None = None
    fresh: Callable[[EngineConfig, Any], nn.Module] | None = None
    learner: str | None = None
    reader: str | None = None
    trees: bool = False
    draft_vocab: bool = False
    reads_hidden: bool = False
    trainable: bool = False
    model_free: bool = False
    config_fields: tuple[str, ...] = ()
    vllm_method: str | None = None
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.trainable and (self.weights is None or self.learner is None):
            raise ValueError(f"drafter kind {self.kind!r} is trainable: it needs its weights class and a learner")
        unknown = [name for name in self.config_fields if name not in EngineConfig.__dataclass_fields__]
        if unknown:
            raise ValueError(f"drafter kind {self.kind!r}: config_fields {unknown} are not EngineConfig fields")

    @property
    def is_head(self) -> bool:
        """Its weights are a head on the target's features (not a drafter LM of its own)."""
        return self.weights is not None and not issubclass(self.weights, PreTrainedModel)


DRAFTERS: dict[str, DrafterSpec] = {}


def register(spec: DrafterSpec) -> DrafterSpec:
    """Make `spec` a kind `EngineConfig.drafters` may list (by its name or an alias). A name taken is a ValueError."""
    for name in (spec.kind, *spec.aliases):
        if name in DRAFTER_SPECS:
            raise ValueError(f"drafter kind {name!r} is registered already")
    DRAFTERS[spec.kind] = spec
    DRAFTER_SPECS.update(dict.fromkeys((spec.kind, *spec.aliases), spec))
    return spec


def unregister(kind: str) -> None:
    """Forget kind `kind` and its aliases (a test's own kind, after the test)."""
    spec = DRAFTERS.pop(kind)
    for name in (spec.kind, *spec.aliases):
        DRAFTER_SPECS.pop(name, None)


def spec_for(name: str) -> DrafterSpec:
    """The spec of kind (or alias) `name`; a ValueError naming the registered ones otherwise."""
    if name not in DRAFTER_SPECS:
        raise ValueError(f"drafter kind {name!r} is unknown: one of {sorted(DRAFTER_SPECS)}")
    return DRAFTER_SPECS[name]


def kind_of(weights: object) -> str | None:
    """The kind whose weights `weights` are (a drafter LM: "model"; a head: its kind), or None."""
    return next((spec.kind for spec in DRAFTERS.values()
                 if spec.weights is not None and isinstance(weights, spec.weights)), None)


def resolve(path: str) -> Any:
    """The object an import path "package.module:name" names (a spec's learner or reader)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


ONLINE = "specroll.online_drafter"
SOURCES = "specroll.integrations"
register(DrafterSpec("model", model.ModelDrafter, model.build, model.memory, PreTrainedModel, learner=f"{ONLINE}.lm.learner:DraftLearner", reader=f"{SOURCES}.model_source:read_drafter_lm", trees=True, draft_vocab=True, trainable=True, vllm_method="draft_model"))  # noqa: E501
register(DrafterSpec("suffix", suffix.SuffixDrafter, suffix.build, model_free=True, config_fields=("suffix",), vllm_method="ngram"))  # noqa: E501
register(DrafterSpec("layer_skip", layer_skip.LayerSkipDrafter, layer_skip.build, draft_vocab=True, config_fields=("layer_skip_layers",)))  # noqa: E501
register(DrafterSpec("eagle", eagle.EagleDrafter, eagle.build, eagle.memory, eagle.EagleHead, eagle.fresh_head, f"{ONLINE}.heads.learner:HeadLearner", f"{SOURCES}.model_source:read_eagle_head", trees=True, draft_vocab=True, reads_hidden=True, trainable=True, config_fields=("eagle_intermediate_size",)))  # noqa: E501
register(DrafterSpec("eagle3", eagle3.Eagle3Drafter, eagle3.build, eagle3.memory, eagle3.Eagle3Head, eagle3.fresh_head, f"{ONLINE}.heads.learner:HeadLearner", f"{SOURCES}.formats.eagle3:read_eagle3_head", trees=True, draft_vocab=True, reads_hidden=True, trainable=True, config_fields=("eagle3_layers", "eagle3_ttt_steps"), vllm_method="eagle3"))  # noqa: E501
register(DrafterSpec("medusa", medusa.MedusaDrafter, medusa.build, medusa.memory, medusa.MedusaHeads, medusa.fresh_head, f"{ONLINE}.heads.learner:HeadLearner", f"{SOURCES}.model_source:read_medusa_heads", trees=True, draft_vocab=True, reads_hidden=True, trainable=True, config_fields=("medusa_heads",)))  # noqa: E501
register(DrafterSpec("block", block.BlockDrafter, block.build, block.memory, block.BlockHead, block.fresh_head, f"{ONLINE}.heads.block_learner:BlockLearner", f"{SOURCES}.formats.dflash:read_block_head", trees=True, draft_vocab=True, reads_hidden=True, trainable=True, config_fields=("block_size", "block_layers"), vllm_method="dflash", aliases=("dflash",)))  # noqa: E501
register(DrafterSpec("recurrent", recurrent.RecurrentDrafter, recurrent.build, recurrent.memory, recurrent.RecurrentHead, recurrent.fresh_head, f"{ONLINE}.heads.learner:HeadLearner", f"{SOURCES}.model_source:read_recurrent_head", trees=True, draft_vocab=True, reads_hidden=True, trainable=True, config_fields=("recurrent_mlp_layers", "recurrent_depths", "recurrent_own_head"), aliases=("redrafter",)))  # noqa: E501
