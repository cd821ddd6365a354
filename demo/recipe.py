"""`DemoRecipe`: everything that determines the demo models, and the hash that names their cache.

The build (`demo.build`) is a pure function of the recipe and `RECIPE_VERSION`, so the cache folder
`demo-<hash>` can be reused whenever both match and must be rebuilt when either changes. Bump
`RECIPE_VERSION` when the build code changes what it produces for the same recipe.

`DemoRecipe()` is the full recipe of the character-level world (a 33.6M-parameter target, a 1.2M
drafter, minutes on 2 cores); `DemoRecipe.tiny()` is the same recipe shrunk to build in seconds, for
tests. `DemoRecipe.bpe()` is the subword world (`world="bpe"`: a 32,768-entry byte-level BPE and the
word-problem task, `demo.world`), `DemoRecipe.bpe_tiny()` its test-sized version. `DemoRecipe.named`
maps the names configs use ("full", "tiny", "bpe", "bpe_tiny", "tiny_heads32") to them.

Fields added after the character-level world (`world`, `vocab_size`, `softmax_negatives`,
`distill_top_k`) enter `to_dict` (and so the hash) only when they differ from their defaults, so the
chars recipes keep the hashes, and the caches, they had.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field

from .world import WORLDS, task_for

RECIPE_VERSION = 4
RECIPE_NAMES = ("full", "tiny", "bpe", "bpe_tiny", "tiny_heads32")
# Fields written into `to_dict` only when they differ from these defaults (the chars world's).
_ADDED_DEFAULTS = {"world": "chars", "vocab_size": None, "softmax_negatives": 0, "distill_top_k": None}


@dataclass(frozen=True)
class ModelShape:
    """A Llama shape. `head_dim = hidden_size // num_heads` must match across core and target."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: an int >= 1")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is invalid: must be a multiple of num_heads={self.num_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class TrainStage:
    """One supervised stage: `steps` AdamW steps of `batch_size` sequences at peak `lr`."""

    steps: int
    batch_size: int
    lr: float

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"steps={self.steps!r} is invalid: an int >= 0")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size!r} is invalid: an int >= 1")
        if not isinstance(self.lr, (int, float)) or not 0 < self.lr < 1:
            raise ValueError(f"lr={self.lr!r} is invalid: a number in (0, 1)")


@dataclass(frozen=True)
class DemoRecipe:
    """How the demo's target and drafter are made.

    The target is grown from a smaller `core` trained on the SFT data (growth preserves its
    function, see `demo.grow`), then fine-tuned briefly at full size: training a 33M model from
    scratch on 2 CPU cores would take hours, decoding with it costs what a 33M model costs. The
    drafter is cut from the core (some of its layers, `demo.truncate`), fitted to the SFT data,
    then distilled on `distill_samples` completions the target sampled at T = 1 (forward KL to the
    target's full distribution at every position).
    `compact_fraction` is the share of the minority (compact) style in the SFT data.

    `world` picks the tokenizer and the task's rendering (`demo.world`); `vocab_size` is the BPE's size
    (bpe world only). At a 32k vocabulary the LM head is most of a small model's training cost, so
    `softmax_negatives` > 0 trains every stage with a sampled softmax (`demo.pretrain`): the loss
    positions' own targets plus that many uniformly drawn negatives per step, instead of all entries;
    0 is the full softmax. `distill_top_k` keeps the target's top-k probabilities per position for the
    drafter's distillation (None: its whole distribution, affordable at ~100 entries only).
    """

    max_digits: int = 8
    compact_fraction: float = 0.2
    core: ModelShape = field(default_factory=lambda: ModelShape(192, 3, 3, 768))
    target: ModelShape = field(default_factory=lambda: ModelShape(512, 8, 8, 2048))
    drafter: ModelShape = field(default_factory=lambda: ModelShape(192, 2, 3, 768))
    core_sft: TrainStage = field(default_factory=lambda: TrainStage(2200, 32, 2e-3))
    target_sft: TrainStage = field(default_factory=lambda: TrainStage(12, 16, 1e-4))
    drafter_sft: TrainStage = field(default_factory=lambda: TrainStage(150, 32, 1e-3))
    drafter_distill: TrainStage = field(default_factory=lambda: TrainStage(300, 32, 1e-3))
    distill_samples: int = 512
    max_position_embeddings: int = 256
    seed: int = 0
    world: str = "chars"
    vocab_size: int | None = None
    softmax_negatives: int = 0
    distill_top_k: int | None = None

    def __post_init__(self) -> None:
        if self.world not in WORLDS:
            raise ValueError(f"world={self.world!r} is invalid: one of {WORLDS}")
        if self.world == "chars" and self.vocab_size is not None:
            raise ValueError(f"vocab_size={self.vocab_size!r} is invalid for world='chars': None (the "
                             "character set decides)")
        if self.world == "bpe" and (not isinstance(self.vocab_size, int) or self.vocab_size < 512):
            raise ValueError(f"vocab_size={self.vocab_size!r} is invalid for world='bpe': an int >= 512")
        if not isinstance(self.softmax_negatives, int) or self.softmax_negatives < 0:
            raise ValueError(f"softmax_negatives={self.softmax_negatives!r} is invalid: an int >= 0 (0: full softmax)")
        if self.distill_top_k is not None and (not isinstance(self.distill_top_k, int) or self.distill_top_k < 1):
            raise ValueError(f"distill_top_k={self.distill_top_k!r} is invalid: an int >= 1 or None (everything)")
        if not isinstance(self.max_digits, int) or not 1 <= self.max_digits <= 18:
            raise ValueError(f"max_digits={self.max_digits!r} is invalid: an int in [1, 18]")
        if not isinstance(self.compact_fraction, (int, float)) or not 0.0 <= self.compact_fraction <= 1.0:
            raise ValueError(f"compact_fraction={self.compact_fraction!r} is invalid: a number in [0, 1]")
        core, target = self.core, self.target
        if target.head_dim != core.head_dim:
            raise ValueError(f"target.head_dim={target.head_dim} is invalid: must equal core.head_dim={core.head_dim}")
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(target, name) < getattr(core, name):
                raise ValueError(
                    f"target.{name}={getattr(target, name)} is invalid: must be >= core.{name}={getattr(core, name)}"
                )
        drafter = self.drafter
        if (drafter.hidden_size, drafter.num_heads, drafter.intermediate_size) != (
            core.hidden_size, core.num_heads, core.intermediate_size
        ) or drafter.num_layers > core.num_layers:
            raise ValueError(
                f"drafter={drafter} is invalid: it is cut from the core, so it needs the core's hidden_size, "
                f"num_heads and intermediate_size and at most core.num_layers={core.num_layers} layers"
            )
        if not isinstance(self.distill_samples, int) or self.distill_samples < 1:
            raise ValueError(f"distill_samples={self.distill_samples!r} is invalid: an int >= 1")
        task = task_for(self.world)
        longest = task.max_prompt_tokens(self.max_digits) + task.max_completion_tokens(self.max_digits)
        if self.max_position_embeddings < longest:
            raise ValueError(
                f"max_position_embeddings={self.max_position_embeddings} is invalid: "
                f"max_digits={self.max_digits} needs >= {longest}"
            )

    @classmethod
    def tiny(cls) -> DemoRecipe:
        """The same recipe at toy scale: builds in seconds, for tests (the models barely learn)."""
        return cls(
            max_digits=3,
            core=ModelShape(32, 1, 2, 64),
            target=ModelShape(64, 2, 4, 128),
            drafter=ModelShape(32, 1, 2, 64),
            core_sft=TrainStage(30, 16, 3e-3),
            target_sft=TrainStage(2, 8, 1e-4),
            drafter_sft=TrainStage(10, 16, 3e-3),
            drafter_distill=TrainStage(10, 16, 1e-3),
            distill_samples=16,
            max_position_embeddings=96,
        )

    @classmethod
    def bpe(cls) -> DemoRecipe:
        """The subword world: a 32,768-entry byte-level BPE, word problems with long-tailed completions
        (SFT mix: ~125 tokens on average, p99 ~520), and shapes sized to build in ~11 min on 2 quiet cores."""
        return cls(
            world="bpe",
            vocab_size=32_768,
            max_digits=10,
            core=ModelShape(128, 3, 4, 512),
            target=ModelShape(512, 8, 16, 2048),
            drafter=ModelShape(128, 2, 4, 512),
            core_sft=TrainStage(1200, 16, 3e-3),
            target_sft=TrainStage(4, 8, 1e-4),
            drafter_sft=TrainStage(0, 16, 1e-3),
            drafter_distill=TrainStage(120, 16, 1e-3),
            distill_samples=128,
            max_position_embeddings=2048,
            softmax_negatives=2048,
            distill_top_k=32,
        )

    @classmethod
    def bpe_tiny(cls) -> DemoRecipe:
        """The subword world at toy scale (the full 32k tokenizer, tiny models): builds in well under a
        minute, for tests (the models barely learn)."""
        return dataclasses.replace(
            cls.tiny(), world="bpe", vocab_size=32_768, max_position_embeddings=1024, softmax_negatives=256,
            distill_top_k=8, distill_samples=8,
        )

    @classmethod
    def tiny_heads32(cls) -> DemoRecipe:
        """`tiny` with attention heads of 32 (two heads of a 64-wide model): the smallest shape vLLM's CPU attention
        runs, for the vLLM engine's tests (`configs/demo_vllm_tiny.yaml`)."""
        return dataclasses.replace(cls.tiny(), core=ModelShape(64, 1, 2, 128), target=ModelShape(64, 2, 2, 128),
                                   drafter=ModelShape(64, 1, 2, 128))

    @classmethod
    def named(cls, name: str) -> DemoRecipe:
        """The recipe a config names: "full", "tiny", "bpe", "bpe_tiny" or "tiny_heads32"."""
        if name not in RECIPE_NAMES:
            raise ValueError(f"recipe={name!r} is invalid: one of {RECIPE_NAMES}")
        return {"full": cls, "tiny": cls.tiny, "bpe": cls.bpe, "bpe_tiny": cls.bpe_tiny,
                "tiny_heads32": cls.tiny_heads32}[name]()

    def to_dict(self) -> dict:
        fields = {k: v for k, v in asdict(self).items() if k not in _ADDED_DEFAULTS or v != _ADDED_DEFAULTS[k]}
        return {"recipe_version": RECIPE_VERSION, **fields}

    @classmethod
    def from_dict(cls, data: dict) -> DemoRecipe:
        """The inverse of `to_dict` (the `recipe_version` key is ignored)."""
        nested = {"core": ModelShape, "target": ModelShape, "drafter": ModelShape, "core_sft": TrainStage,
                  "target_sft": TrainStage, "drafter_sft": TrainStage, "drafter_distill": TrainStage}
        fields = {k: nested[k](**v) if k in nested else v for k, v in data.items() if k != "recipe_version"}
        return cls(**fields)

    @property
    def hash(self) -> str:
        """12 hex digits of the SHA-256 of the recipe and `RECIPE_VERSION`."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]
