"""Where the rollout engines load the models from (`ModelPaths`), the drafter a run's engine config asks
for (`load_drafter`: the drafter LM, or an EAGLE / EAGLE-3 / Medusa head shaped after the target — an EAGLE-3 one
also from a public checkpoint folder, `formats.eagle3`; a block head also from a z-lab DFlash folder,
`formats.dflash`), and the target's and drafter's tokenizers for the
engine's vocabulary check, when they can be found."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from specroll.rollout import EngineConfig
from specroll.rollout.config import require
from specroll.rollout.drafters.block_head import BlockHead
from specroll.rollout.drafters.draft_vocab import carry, split_state
from specroll.rollout.drafters.eagle3_head import Eagle3Head
from specroll.rollout.drafters.factory import fresh_block, fresh_eagle3
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads

from .tokenizers import load_tokenizer

# drafter kinds whose weights are a head on the target's hidden states
HEAD_KINDS = ("eagle", "eagle3", "medusa", "block")


@dataclass
class ModelPaths:
    """`save_pretrained` directories (or hub ids already in the local cache) loaded inside the actors.

    The tokenizers (by default looked for in the model folders themselves) let the engine compare
    the two vocabularies token by token — needed when the embedding tables are padded to different
    sizes (e.g. Qwen2.5-7B's 152064 rows vs 0.5B's 151936 over the same tokenizer).

    `head` is a head's `state_dict` file (`torch.save`) for an "eagle", "eagle3", "medusa" or "block" drafter
    (None: a fresh head, which the online learner trains from the first rollouts; a file that carries the draft
    vocabulary it was trained over, `specroll distill --draft-vocab`, starts `engine.draft_vocab` there); for
    "eagle3" also a public checkpoint folder (speculators or SpecForge layout:
    `formats.eagle3.load_eagle3_checkpoint`, refused if it does not fit the target); for "block" also a z-lab
    DFlash checkpoint folder (`formats.dflash.load_block_checkpoint`).
    """

    target: str = ""
    drafter: str | None = None
    target_tokenizer: str | None = None
    drafter_tokenizer: str | None = None
    head: str | None = None

    def __post_init__(self) -> None:
        require(bool(self.target), "models.target", self.target, "a model path")


def tokenizer_pair(models: ModelPaths) -> tuple[PreTrainedTokenizerBase | None, PreTrainedTokenizerBase | None]:
    """(target, drafter) tokenizers if both are found, else (None, None): the engine then compares sizes."""
    if not models.drafter:
        return None, None
    target = load_tokenizer(models.target_tokenizer or models.target)
    drafter = load_tokenizer(models.drafter_tokenizer or models.drafter)
    return (target, drafter) if target is not None and drafter is not None else (None, None)


def trained_drafter_kind(models: ModelPaths, engine: EngineConfig) -> str | None:
    """The drafter kind with weights the engine serves and an online learner can train: "eagle" / "eagle3" / "medusa"
    when `engine.drafters` lists one, "model" for a drafter LM at `models.drafter` (listed, or
    `drafters` None), else None (layer-skip and suffix drafting have nothing to train)."""
    kinds = engine.drafters
    head = next((kind for kind in HEAD_KINDS if kinds is not None and kind in kinds), None)
    if head is not None:
        return head
    return "model" if models.drafter and (kinds is None or "model" in kinds) else None


def load_drafter(models: ModelPaths, engine: EngineConfig, target: PreTrainedModel | None
                 ) -> PreTrainedModel | EagleHead | Eagle3Head | MedusaHeads | BlockHead | None:
    """The drafter weights to pass to `SpecEngine` (and to train online), by `trained_drafter_kind`: the
    drafter LM, or a head shaped after `target` (needed only then) with `models.head`'s weights if given."""
    kind = trained_drafter_kind(models, engine)
    if kind == "model":
        return AutoModelForCausalLM.from_pretrained(models.drafter, dtype=engine.dtype)
    if kind is None:
        return None
    if target is None:
        raise ValueError(f"an {kind!r} head is shaped after the target: load_drafter needs it, got None")
    if kind == "eagle3":
        return _eagle3_head(models, engine, target)
    if kind == "block":
        return _block_head(models, engine, target)
    weights, ids = _head_file(models.head)
    if kind == "medusa":
        head = MedusaHeads(target.config.get_text_config().hidden_size, engine.medusa_heads)
    else:
        head = EagleHead.for_target(target.config, intermediate_size=_eagle_width(weights, engine, models.head))
    if weights is not None:
        head.load_state_dict(weights)
    return carry(head, ids)


def _head_file(path: str | None) -> tuple[dict | None, torch.Tensor | None]:
    """A head's state dict file → (its weights, the draft vocabulary it was trained over if it carries one:
    `draft_vocab.STATE_KEY`, from `specroll distill --draft-vocab`); (None, None) without a file."""
    if not path:
        return None, None
    return split_state(torch.load(path, weights_only=True))


def _eagle_width(weights: dict | None, engine: EngineConfig, path: str | None) -> int | None:
    """The EAGLE head's MLP width: its weights' (`models.head`), which `engine.eagle_intermediate_size`
    must then agree with, else the engine's (None: the target's)."""
    if weights is None or "gate_proj.weight" not in weights:
        return engine.eagle_intermediate_size
    width = int(weights["gate_proj.weight"].shape[0])
    if engine.eagle_intermediate_size not in (None, width):
        raise ValueError(f"engine.eagle_intermediate_size={engine.eagle_intermediate_size} does not match the "
                         f"head at models.head={path!r}, whose MLP is {width} wide: set it to {width} or leave it "
                         f"unset (the weights decide)")
    return width


def _eagle3_head(models: ModelPaths, engine: EngineConfig, target: PreTrainedModel) -> Eagle3Head:
    """`models.head` as a public checkpoint folder, a `state_dict` file over a fresh head, or (None) a fresh head;
    a checkpoint brings its layers, which `engine.eagle3_layers` (if set) must name too."""
    from .formats.eagle3 import load_eagle3_checkpoint

    if models.head and Path(models.head).is_dir():
        head = load_eagle3_checkpoint(models.head, target, load_tokenizer(models.target_tokenizer or models.target),
                                      engine.eagle3_ttt_steps)
        if engine.eagle3_layers not in (None, head.target_layers):
            raise ValueError(f"engine.eagle3_layers={engine.eagle3_layers} does not match the checkpoint at "
                             f"models.head={models.head!r}, whose layers are {head.target_layers}: set them or "
                             "leave engine.eagle3_layers unset (the checkpoint decides)")
        return head
    head = fresh_eagle3(engine, target.config)
    weights, ids = _head_file(models.head)
    if weights is not None:
        if "lm_head.weight" in weights:
            raise ValueError(f"models.head={models.head!r} holds an EAGLE-3 head with its own LM head, whose draft ids "
                             "a state_dict does not carry: give it as a checkpoint folder (speculators or SpecForge "
                             "layout, integrations.formats.eagle3)")
        head.load_state_dict(weights)
    return carry(head, ids)


def _block_head(models: ModelPaths, engine: EngineConfig, target: PreTrainedModel) -> BlockHead:
    """`models.head` as a z-lab DFlash checkpoint folder, a `state_dict` file over a fresh head, or (None) a fresh
    head (`engine.block_layers`, `engine.block_size`); the engine checks a checkpoint's layers against
    `engine.block_layers` (`drafters.factory.check_block_fits`)."""
    from .formats.dflash import load_block_checkpoint

    if models.head and Path(models.head).is_dir():
        return load_block_checkpoint(models.head, target)
    head = fresh_block(engine, target.config)
    weights, ids = _head_file(models.head)
    if weights is not None:
        head.load_state_dict(weights)
    return carry(head, ids)
