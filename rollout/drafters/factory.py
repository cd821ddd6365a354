"""make_drafter: the engine's `Drafter` from what `SpecEngine` was given and what `EngineConfig.drafters` lists.

The kinds and what each needs: "model" the drafter LM passed to `SpecEngine`; "suffix" nothing;
"layer_skip" the target's own layers (`layer_skip.LayerSkipDrafter`); "eagle" / "medusa" a head passed
as the drafter (`heads.EagleHead` / `heads.MedusaHeads`) or, without one, a fresh head shaped after the
target (the learner trains its first version from the first rollouts). "suffix" with one model-like
kind is a `suffix_or_model.SuffixOrModelDrafter`.
"""

from __future__ import annotations

from transformers import PreTrainedModel

from ..config import EngineConfig
from ..models.cache import LayerShape, probe_layer_shapes
from ..models.memory import module_bytes
from ..models.runner import ModelRunner
from .eagle import EagleDrafter
from .heads import EagleHead, MedusaHeads
from .layer_skip import LayerSkipDrafter
from .medusa import MedusaDrafter
from .model import ModelDrafter
from .protocol import Drafter
from .suffix import SuffixDrafter
from .suffix_or_model import SuffixOrModelDrafter

# The drafter objects SpecEngine wraps (anything else non-None is a `Drafter`, used as given).
DrafterWeights = PreTrainedModel | EagleHead | MedusaHeads
HEAD_KINDS = {EagleHead: "eagle", MedusaHeads: "medusa"}


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
    if "medusa" in kinds:
        heads = drafter if isinstance(drafter, MedusaHeads) else MedusaHeads(
            model.config.get_text_config().hidden_size, config.medusa_heads)
        return MedusaDrafter(heads, model.get_output_embeddings(), dtype, device)
    return None


def drafter_memory(drafter: DrafterWeights | Drafter | None, config: EngineConfig, target: PreTrainedModel
                   ) -> tuple[list | None, int, bool]:
    """What the drafter `make_drafter` will build needs, before it is built: its cache's layer shapes (None: no
    cache of its own), its weights' bytes, and whether it reads the target's hidden states."""
    kinds = config.drafters if config.drafters is not None else (
        _kinds_of(drafter) if drafter is None or isinstance(drafter, DrafterWeights) else ())
    reads_hidden = bool({"eagle", "medusa"} & set(kinds))
    if "model" in kinds and isinstance(drafter, PreTrainedModel):
        return probe_layer_shapes(drafter), module_bytes(drafter, config.dtype), reads_hidden
    if "eagle" in kinds:
        head = drafter if isinstance(drafter, EagleHead) else EagleHead.for_target(target.config)
        return [LayerShape(head.num_kv_heads, head.head_dim, head.head_dim)], module_bytes(head, config.dtype), True
    weights = module_bytes(drafter, config.dtype) if isinstance(drafter, MedusaHeads) else 0
    return None, weights, reads_hidden
