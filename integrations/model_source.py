"""Where the rollout engines load the models from (`ModelPaths`), the drafter a run's engine config asks
for (`load_drafter`: its kind's reader, `rollout.drafters.registry` — the drafter LM, or a head shaped after the
target from specroll's own head file, `head_file`; an EAGLE-3 one also from a public checkpoint folder,
`formats.eagle3`; a block head also from a z-lab DFlash folder, `formats.dflash`), and the target's and
drafter's tokenizers for the engine's vocabulary check, when they can be found."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from specroll.rollout import EngineConfig
from specroll.rollout.config import require
from specroll.rollout.drafters.draft_vocab import carry
from specroll.rollout.drafters.heads import EagleHead, MedusaHeads, RecurrentHead
from specroll.rollout.drafters.registry import DRAFTERS, resolve

from .head_file import read_head_file
from .tokenizers import load_tokenizer


@dataclass
class ModelPaths:
    """`save_pretrained` directories (or hub ids already in the local cache) loaded inside the actors.

    The tokenizers (by default looked for in the model folders themselves) let the engine compare
    the two vocabularies token by token — needed when the embedding tables are padded to different
    sizes (e.g. Qwen2.5-7B's 152064 rows vs 0.5B's 151936 over the same tokenizer).

    `head` is a head's `state_dict` file (`torch.save`) for an "eagle", "eagle3", "medusa", "block" or "recurrent"
    drafter
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
    """The drafter kind with weights the engine serves and an online learner can train: the trainable kind
    `engine.drafters` lists (a head's; "model" only with a drafter LM at `models.drafter`), or "model" for a drafter LM
    at `models.drafter` when `drafters` is None; else None (layer-skip and suffix drafting have nothing to train)."""
    kinds = engine.drafters if engine.drafters is not None else ("model",)
    kind = next((kind for kind in kinds if DRAFTERS[kind].trainable), None)
    if kind is None or (not DRAFTERS[kind].is_head and not models.drafter):
        return None
    return kind


def load_drafter(models: ModelPaths, engine: EngineConfig, target: PreTrainedModel | None) -> nn.Module | None:
    """The drafter weights to pass to `SpecEngine` (and to train online), by `trained_drafter_kind` and its spec's
    reader: the drafter LM, or a head shaped after `target` (needed only then) with `models.head`'s weights if given."""
    kind = trained_drafter_kind(models, engine)
    if kind is None:
        return None
    if DRAFTERS[kind].is_head and target is None:
        raise ValueError(f"an {kind!r} head is shaped after the target: load_drafter needs it, got None")
    return resolve(DRAFTERS[kind].reader)(models, engine, target)


def read_drafter_lm(models: ModelPaths, engine: EngineConfig, target: PreTrainedModel | None) -> PreTrainedModel:
    """The "model" kind's reader: the drafter LM saved at `models.drafter`, in the engine's dtype."""
    return AutoModelForCausalLM.from_pretrained(models.drafter, dtype=engine.dtype)


def read_eagle_head(models: ModelPaths, engine: EngineConfig, target: PreTrainedModel) -> EagleHead:
    """The "eagle" kind's reader: a head shaped after `target`, with `models.head`'s weights (a head file) if given."""
    saved = None if not models.head else read_head_file(models.head)
    weights = None if saved is None else saved.weights
    head = EagleHead.for_target(target.config, intermediate_size=_eagle_width(weights, engine, models.head))
    return load_head_file(head, models.head)


def read_medusa_heads(models: ModelPaths, engine: EngineConfig, target: PreTrainedModel) -> MedusaHeads:
    """The "medusa" kind's reader: `engine.medusa_heads` heads, with `models.head`'s weights (a head file) if given."""
    return load_head_file(DRAFTERS["medusa"].fresh(engine, target.config), models.head)


def read_recurrent_head(models: ModelPaths, engine: EngineConfig, target: PreTrainedModel) -> RecurrentHead:
    """The "recurrent" kind's reader: a head shaped as `models.head`'s weights (a head file; its residual blocks, and
    an own LM head over the draft vocabulary the file carries), which the engine's `recurrent_mlp_layers` and
    `recurrent_own_head` must then agree with; else a fresh head of the engine's settings, whose own LM head (with
    `recurrent_own_head`) starts as the target's rows for its ids."""
    if not models.head:
        head = DRAFTERS["recurrent"].fresh(engine, target.config)
        if head.lm_head is not None:
            lm_head = target.get_output_embeddings().weight.detach()
            head.lm_head.weight.data.copy_(lm_head[head.draft_ids.to(lm_head.device)])
        return carry(head, None)
    saved = read_head_file(models.head)
    layers = sum(name.startswith("blocks.") and name.endswith(".linear.weight") for name in saved.weights)
    own = "lm_head.weight" in saved.weights
    for name, value, file_value in (("recurrent_mlp_layers", engine.recurrent_mlp_layers, layers),
                                    ("recurrent_own_head", engine.recurrent_own_head, own)):
        if value != file_value:
            raise ValueError(f"engine.{name}={value!r} does not match the head at models.head={models.head!r} "
                             f"({file_value!r}): set it to {file_value!r}")
    if own and saved.draft_vocab is None:
        raise ValueError(f"models.head={models.head!r} is invalid: its own LM head's ids are missing (a recurrent "
                         "head with its own LM head is saved with its draft vocabulary)")
    head = RecurrentHead.for_target(target.config, layers, engine.recurrent_depths, saved.draft_vocab if own else None)
    return load_head_file(head, models.head)


def load_head_file(head: nn.Module, path: str | None) -> nn.Module:
    """`head` with the weights of the head file at `path` (None: as it is), carrying the draft vocabulary it was
    trained over (`draft_vocab.carry`: `engine.draft_vocab` starts there)."""
    if not path:
        return carry(head, None)
    saved = read_head_file(path)
    head.load_state_dict(saved.weights)
    return carry(head, saved.draft_vocab)


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
