"""make_drafter: the engine's `Drafter` from what `SpecEngine` was given and what `EngineConfig.drafters` lists.

The kinds and what each needs: "model" the drafter LM passed to `SpecEngine`; "suffix" nothing;
"layer_skip" the target's own layers (`layer_skip.LayerSkipDrafter`); "eagle" / "eagle3" / "medusa" a head
passed as the drafter (`heads.EagleHead` / `eagle3_head.Eagle3Head` / `heads.MedusaHeads`) or, without one, a
fresh head shaped after the target (the learner trains its first version from the first rollouts).
"eagle3" also tells the target's runner which layers' states verification captures
(`ModelRunner.capture_hidden`); so does "block" (`block.BlockDrafter`, a `block_head.BlockHead`: the outputs of its
`target_layers`). "suffix" with one model-like kind is a `suffix_or_model.SuffixOrModelDrafter`.
"""

from __future__ import annotations

from transformers import PreTrainedModel

from ..config import EngineConfig
from ..models.cache import LayerShape, probe_layer_shapes
from ..models.memory import module_bytes
from ..models.runner import ModelRunner
from .block import BlockDrafter
from .eagle import EagleDrafter
from .eagle3 import Eagle3Drafter
from .heads import EagleHead, MedusaHeads
from .heads.block import BlockHead
from .heads.eagle3 import Eagle3Head
from .layer_skip import LayerSkipDrafter
from .medusa import MedusaDrafter
from .model import ModelDrafter
from .protocol import Drafter
from .suffix import SuffixDrafter
from .suffix_or_model import SuffixOrModelDrafter

# The drafter objects SpecEngine wraps (anything else non-None is a `Drafter`, used as given).
DrafterWeights = PreTrainedModel | EagleHead | Eagle3Head | MedusaHeads | BlockHead
HEAD_KINDS = {EagleHead: "eagle", Eagle3Head: "eagle3", MedusaHeads: "medusa", BlockHead: "block"}


def make_drafter(drafter: DrafterWeights | Drafter | None, config: EngineConfig, target: ModelRunner) -> Drafter | None:
    """The engine's drafter: a `Drafter` object as given; else what `config.drafters` lists, built from
    `drafter` (None: what `drafter` is — an LM "model", a head its kind — else no drafter)."""
    if drafter is not None and not isinstance(drafter, DrafterWeights):
        if config.drafters is not None:
            raise ValueError(f"drafters={config.drafters!r} is invalid with a Drafter object passed to "
                             "SpecEngine (it is used as given): leave drafters None")
        return drafter
    kinds = config.drafters if config.drafters is not None else _kinds_of(drafter)
    given = "model" if isinstance(drafter, PreTrainedModel) else HEAD_KINDS.get(type(drafter))
    if "model" in kinds and given != "model":
        raise ValueError(f"drafters={kinds!r} is invalid: 'model' needs a drafter LM passed to SpecEngine")
    if given is not None and given not in kinds:
        raise ValueError(f"drafters={kinds!r} is invalid with a {type(drafter).__name__} passed to SpecEngine "
                         f"(it drafts as {given!r}): list {given!r}")
    model = _model_kind(kinds, drafter, config, target)
    suffix = SuffixDrafter(config.max_batch_size, target.vocab_size, target.device, config.suffix) \
        if "suffix" in kinds else None
    if model is not None and suffix is not None:
        return SuffixOrModelDrafter(suffix, model, target.vocab_size)
    return model or suffix


def _kinds_of(drafter: DrafterWeights | None) -> tuple[str, ...]:
    if drafter is None:
        return ()
    return ("model",) if isinstance(drafter, PreTrainedModel) else (HEAD_KINDS[type(drafter)],)


def _model_kind(kinds: tuple[str, ...], drafter: DrafterWeights | None, config: EngineConfig,
                target: ModelRunner) -> Drafter | None:
    slots, length, dtype, device = config.max_batch_size, config.cache_len, config.dtype, target.device
    model = target.model
    if "model" in kinds:
        return ModelDrafter(drafter, slots, length, dtype, device, target.vocab_size, config.lean_forward,
                            config.state_history, config.prefill_chunk_tokens)
    if "layer_skip" in kinds:
        layers = config.layer_skip_layers or max(1, model.config.get_text_config().num_hidden_layers // 2)
        return LayerSkipDrafter(target, layers)
    if "eagle" in kinds:
        head = drafter if isinstance(drafter, EagleHead) else EagleHead.for_target(
            model.config, intermediate_size=config.eagle_intermediate_size)
        return EagleDrafter(head, model.get_input_embeddings(), model.get_output_embeddings(), slots, length,
                            dtype, device)
    if "eagle3" in kinds:
        head = drafter if isinstance(drafter, Eagle3Head) else fresh_eagle3(config, model.config)
        target.capture_hidden(head.target_layers)
        return Eagle3Drafter(head, model.get_input_embeddings(), model.get_output_embeddings(), slots, length,
                             dtype, device)
    if "block" in kinds:
        head = drafter if isinstance(drafter, BlockHead) else fresh_block(config, model.config)
        check_block_fits(head, model.config, config)
        target.capture_hidden(head.capture_layers)
        return BlockDrafter(head, model.get_input_embeddings(), model.get_output_embeddings(), slots, length,
                            dtype, device)
    if "medusa" in kinds:
        heads = drafter if isinstance(drafter, MedusaHeads) else MedusaHeads(
            model.config.get_text_config().hidden_size, config.medusa_heads)
        return MedusaDrafter(heads, model.get_output_embeddings(), dtype, device)
    return None


def fresh_eagle3(config: EngineConfig, target_config) -> Eagle3Head:
    """A fresh EAGLE-3 head for the target: `config.eagle3_layers` (None: low / middle / high), the target's MLP
    width, `config.eagle3_ttt_steps` depths, the target's LM head."""
    return Eagle3Head.for_target(target_config, config.eagle3_layers, ttt_steps=config.eagle3_ttt_steps)


def fresh_block(config: EngineConfig, target_config) -> BlockHead:
    """A fresh block head for the target: `config.block_layers` (None: `block_head.default_layers`), one draft
    layer, `config.block_size`."""
    return BlockHead.for_target(target_config, config.block_layers, config.block_size)


def check_block_fits(head: BlockHead, target_config, config: EngineConfig) -> None:
    """A `ValueError` naming the field where `head` cannot serve this target under `config`. Its block size is
    its own (a step drafts at most min(its k, `config.block_size`) - 1: `max_gamma` is capped by the config's)."""
    count = target_config.get_text_config().num_hidden_layers
    if head.target_layers[-1] > count - 2:
        raise ValueError(f"block layers {list(head.target_layers)} do not fit a target of {count} layers: "
                         f"ids in [0, {count - 2}] (the outputs verification captures are below the last layer)")
    if config.block_layers not in (None, head.target_layers):
        raise ValueError(f"engine.block_layers={config.block_layers} does not match the block head's target_layers="
                         f"{head.target_layers}: leave engine.block_layers unset (the head decides)")


def drafter_memory(drafter: DrafterWeights | Drafter | None, config: EngineConfig, target: PreTrainedModel
                   ) -> tuple[list | None, int, int | None]:
    """What the drafter `make_drafter` will build needs, before it is built: its cache's layer shapes (None: no
    cache of its own), its weights' bytes, and the width per position of the target's states it reads (None:
    it reads none)."""
    kinds = config.drafters if config.drafters is not None else (
        _kinds_of(drafter) if drafter is None or isinstance(drafter, DrafterWeights) else ())
    hidden = target.config.get_text_config().hidden_size
    width = hidden if {"eagle", "medusa"} & set(kinds) else None
    if "block" in kinds:
        head = drafter if isinstance(drafter, BlockHead) else fresh_block(config, target.config)
        shape = LayerShape(head.num_kv_heads, head.head_dim, head.head_dim)
        return [shape] * len(head.layers), module_bytes(head, config.dtype), hidden * len(head.target_layers)
    if "model" in kinds and isinstance(drafter, PreTrainedModel):
        return probe_layer_shapes(drafter), module_bytes(drafter, config.dtype), width
    if "eagle" in kinds or "eagle3" in kinds:
        if "eagle3" in kinds:
            head = drafter if isinstance(drafter, Eagle3Head) else fresh_eagle3(config, target.config)
            width = hidden * len(head.target_layers)
        else:
            head = drafter if isinstance(drafter, EagleHead) else EagleHead.for_target(target.config)
        return [LayerShape(head.num_kv_heads, head.head_dim, head.head_dim)], module_bytes(head, config.dtype), width
    weights = module_bytes(drafter, config.dtype) if isinstance(drafter, MedusaHeads) else 0
    return None, weights, width
