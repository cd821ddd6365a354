"""Configuration of one `generate` call (`SamplingParams`) and of the engine (`EngineConfig`).

Both are validated in `__post_init__` so bad values fail at the boundary, before any model call,
with a `ValueError` that names the field, the value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .core.stats import TRACE_STEPS
from .placement.device import parse_drafter_device
from .require import require
from .suffix_config import SuffixConfig


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled. `temperature == 0` means greedy (argmax) decoding.

    `top_k == 0` disables top-k; `top_p == 1.0` disables nucleus filtering. `seed` makes a call
    reproducible: every random number a request uses is a function of (seed, its prompt and sample
    index, position), so a request's tokens do not depend on the batch size, slot order or worker;
    with `EngineConfig.sampler="invariant"` not on the drafter or γ either ("auto" included), while
    the rejection sampler's depend on the row's γ schedule (`sampling.accept` says exactly what). An unseeded
    call draws a seed and records it in each `Rollout`.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        require(
            isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
            "max_new_tokens", self.max_new_tokens, "an int >= 1",
        )
        t = self.temperature
        require(
            isinstance(t, (int, float)) and math.isfinite(t) and t >= 0,
            "temperature", t, "a finite number >= 0 (0 = greedy)",
        )
        require(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", self.top_k, "an int >= 0 (0 = off)")
        p = self.top_p
        require(
            isinstance(p, (int, float)) and math.isfinite(p) and 0 < p <= 1,
            "top_p", p, "a number in (0, 1]",
        )
        object.__setattr__(self, "stop_token_ids", tuple(int(s) for s in self.stop_token_ids))
        require(
            all(s >= 0 for s in self.stop_token_ids), "stop_token_ids", self.stop_token_ids,
            "non-negative token ids",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GammaSetting = int | Literal["auto", "auto_simple"]
SamplerName = Literal["rejection", "invariant"]
SAMPLER_NAMES = ("rejection", "invariant")
KVCacheKind = Literal["dense", "paged"]
KV_CACHE_KINDS = ("dense", "paged")
SPECULATION_MODES = ("always", "when_learned")  # EngineConfig.speculation
ENGINE_KINDS = ("specroll", "vllm")  # EngineConfig.kind
MAX_TREE_WIDTH = 16  # nodes per tree level (`EngineConfig.max_tree_width`)
# The kinds `EngineConfig.drafters` may list, by name and alias → their `drafters.registry.DrafterSpec`: the registry
# fills it (`specroll.rollout` imports it before any config can be made); kinds are registered there, in one place.
DRAFTER_SPECS: dict[str, Any] = {}


@dataclass
class EngineConfig:
    """Engine-wide settings.

    `max_batch_size` is the number of batch slots (rows decoded together); more requests than slots
    queue and refill finished slots. `max_seq_len` bounds prompt + completion per row. `gamma` is the
    number of drafted tokens per step (0 = plain decoding), `"auto"` (chosen per step from a
    measured cost model, up to `max_gamma`: `gamma.auto.AutoGamma`) or `"auto_simple"` (the same aim with
    a simpler model, `gamma.simple.SimpleGamma`; slower in paired runs). `record_signals` keeps the
    target's top-`signal_top_k` processed probabilities at each generated position for online draft
    learning. `lean_forward` runs Llama-family models (Llama, Mistral, Qwen2, Qwen3 with sdpa) through
    `models.lean`'s fused forward instead of HF's module tree (same weights and math, far fewer kernel calls);
    other models always use HF's forward. `stats_trace_steps` bounds the per-step traces of
    `EngineStats` (the last that many steps; totals are unbounded counters).
    `allow_unverified_architectures` lets the engine run a target or drafter whose `model_type` the
    architecture sweep has not verified exact (`models.architectures`); its tokens may then be
    silently wrong.

    `sampler` is the speculative accept rule (`sampling.accept`): "rejection" (lossless in distribution,
    acceptance 1 − TV(p, q)) or "invariant" (a seed's tokens are plain decoding's whatever the drafter
    and γ; acceptance ≥ (1 − TV) / (1 + TV)). It is an engine setting, like γ: it only matters when
    drafting (with γ = 0 both are the same plain decoding), and what auto-γ's acceptance estimates and
    the learner's draft signals measure depends on it, so one engine keeps one rule.

    `drafters` lists the drafter kinds to run (`drafters.registry`): "model" (the drafter LM passed to `SpecEngine`) and
    "suffix" (model-free, over sibling and earlier completions of the same prompt; `suffix` configures
    it), "layer_skip" (the target's first `layer_skip_layers` layers; None: half of them), "eagle" (an
    EAGLE-style head on the target's hidden states; a fresh one's MLP is `eagle_intermediate_size` wide,
    None: the target's) and "medusa" (`medusa_heads` residual heads on them); the two heads take
    their weights from the `drafters.heads.EagleHead` / `drafters.heads.MedusaHeads` passed to `SpecEngine`
    as its drafter, else start fresh. At most one of "model", "layer_skip", "eagle", "medusa", with or
    without "suffix": with the suffix drafter each row each step takes the proposal expected to keep the
    most tokens (`drafters.suffix_or_model`), all rows still verified in one target forward.
    None: the drafter passed to `SpecEngine` as what it is (an LM: "model"), else plain decoding.
    "eagle3" is an EAGLE-3 head (`drafters.eagle3`) on the residual stream entering the target's decoder layers
    `eagle3_layers` (sorted ids, vLLM's numbering; None: low / middle / high, `heads.eagle3.default_layers`),
    captured by verification; a fresh one is trained online at `eagle3_ttt_steps` draft depths (its training-time
    test) and drafts through the target's LM head; one passed as the drafter (a public checkpoint:
    `integrations.formats.eagle3`) brings its layers, depths and LM head.
    "block" (alias "dflash"): a DFlash-style block drafter (`drafters.block`) on the outputs of target layers
    `block_layers` (None: `heads.block.default_layers`); one forward drafts up to `block_size` - 1 tokens (`max_gamma`
    is capped there). A head passed as the drafter (`integrations.formats.dflash`) brings both.
    "recurrent" (alias "redrafter"): a ReDrafter head (`drafters.recurrent`): one recurrent layer started from the
    target's newest hidden state, fed each draft's embedding, read out through `recurrent_mlp_layers` residual blocks
    and the target's LM head (with `recurrent_own_head`, a fresh one's own over the first `draft_vocab` ids, trained
    with it); trees are its beam search, `tree_width` beams; the online learner unrolls it `recurrent_depths` drafts.

    `draft_vocab` N: the drafter with an LM head ("model", "eagle", "eagle3", "medusa", "block", "recurrent",
    "layer_skip") drafts over N target ids only, through those rows of its head (`drafters.draft_vocab`): cheaper
    drafts at a large vocabulary, the output still exactly the target's. The first subset: the one a head carries
    (`specroll distill --draft-vocab`), else the first N ids and the stop ids; `SpecEngine.set_draft_vocab` and a
    drafter version that carries one (the online learner's, from rollouts) replace it. None: the whole vocabulary.

    `kv_cache` "paged" keeps the target's attention K/V in blocks of `kv_block_size` tokens taken as rows
    grow and given back as they finish, siblings of a prompt sharing its full blocks (`models.paged`);
    requests wait for free blocks. "dense" (the default) preallocates `[max_batch_size, H, cache_len, D]`
    per layer. Drafter caches and recurrent state stay dense either way. `memory_budget` (bytes, or a float
    share of the device's memory) bounds weights + KV + recurrent state + workspace (`models.memory`): a
    config that cannot fit is refused at construction with the bytes per part; a paged cache's pool is what
    the budget leaves (at most the dense cache's size; without a budget, exactly that).
    `prefill_chunk_tokens` N: a prefill (or a drafter's catch-up) of more than N tokens (rows × longest
    prompt) runs as forwards of at most N tokens each, so its activations stay bounded; None: one forward.

    `tree_width` w ≥ 2: every speculative step drafts a tree of γ levels of w nodes per row, all verified in one
    target forward (`step.tree`; a fixed shape, for benchmarks); "auto" (needs `gamma="auto"`): the width is
    chosen per step, up to `max_tree_width`, from the measured forward cost at the live batch and the trees'
    acceptance so far (`gamma.tree_shape`) — chains (w = 1) where a wider verification costs more than it keeps, as
    at full batch. 1 (the default): chains only. Trees need a drafter that proposes them (the drafter LM, alone
    or with the suffix drafter) and a target and drafter without recurrent layers.

    `speculation` "when_learned" (a drafter that starts from nothing: a fresh EAGLE head) keeps the engine at
    plain decoding — no drafts, no draft forwards — until a drafter version arrives with its held-out expected
    acceptance (`load_drafter`, `DrafterVersion.acceptance`: the online learner measures it on recorded
    positions, without drafting) at or above `SpecEngine.break_even_acceptance`, and off again while a later
    version's is below; once a version drafts, what its drafts kept overrules that number (`gamma.speculation_gate`).
    It needs an adaptive `gamma` (the cost model says where break-even is). "always": draft whenever there is a
    drafter (γ as `gamma` says).

    `drafter_device` places the drafter LM ("model", chains) apart from the target (`placement.device`): a torch device
    ("cpu" beside a "cuda" target: the host's cores draft while the accelerator verifies) or, on a CPU, its own cores
    ("cpu:N": the last N of the process's, "cpu:cores=1-2"): the drafter then runs in its own OS thread pinned to them,
    the target on the rest (`placement.threads`). None: the target's device, in series. `overlap` True drafts each
    step's successor while the target verifies it (PEARL's post-verify, `placement.ahead`: kept where the whole step
    and the drafter's guess of the next token held, rolled back elsewhere; lossless under both samplers); "auto" per
    live batch size where its measured steps beat serial ones (`gamma.overlap_choice`); False: never.

    `kind` the engine that runs these settings: "specroll" (`SpecEngine`, every field) or "vllm"
    (`integrations.vllm.VllmEngine`: the fields vLLM can honour, the rest refused by name when it is built).
    """

    max_batch_size: int = 16
    max_seq_len: int = 1024
    gamma: GammaSetting = 4
    max_gamma: int = 8
    device: str = "cpu"
    dtype: torch.dtype | str = torch.float32
    record_signals: bool = False
    signal_top_k: int = 16
    calibration_cache: str | None = None
    cost_model_budget_s: float = 8.0  # auto-γ's calibration: rounds past the first two stop at it
    # Per-step decay of auto-γ's acceptance counts (memory ~10 steps; steps of fewer than 4 rows decay
    # less, see `gamma.estimate.MEMORY_ROWS`). 0.98 (~50 steps) measured better on the long-running rollout
    # workload (greedy 0.992× vs 0.968× of γ = 4, lockstep) and worse on short sampled batches with a
    # stop token (b = 4: 0.89–0.91× vs 1.01×) — though those cells later proved to be mostly each
    # contender's sampling luck (see the README's benchmark notes); not re-measured since.
    acceptance_ema: float = 0.9
    lean_forward: bool = True
    stats_trace_steps: int = TRACE_STEPS
    sampler: SamplerName = "rejection"
    allow_unverified_architectures: bool = False
    drafters: tuple[str, ...] | None = None
    suffix: SuffixConfig = field(default_factory=SuffixConfig)
    layer_skip_layers: int | None = None
    eagle_intermediate_size: int | None = None
    medusa_heads: int = 4
    eagle3_layers: tuple[int, ...] | None = None
    eagle3_ttt_steps: int = 3
    block_size: int = 8
    block_layers: tuple[int, ...] | None = None
    recurrent_mlp_layers: int = 2
    recurrent_depths: int = 3
    recurrent_own_head: bool = False
    draft_vocab: int | None = None
    kv_cache: KVCacheKind = "dense"
    kv_block_size: int = 16
    memory_budget: int | float | None = None
    prefill_chunk_tokens: int | None = None
    tree_width: int | Literal["auto"] = 1
    max_tree_width: int = 4
    speculation: str = "always"
    kind: str = "specroll"
    drafter_device: str | None = None
    overlap: bool | Literal["auto"] = False

    def __post_init__(self) -> None:
        require(self.speculation in SPECULATION_MODES, "speculation", self.speculation, f"one of {SPECULATION_MODES}")
        require(self.kind in ENGINE_KINDS, "kind", self.kind, f"one of {ENGINE_KINDS}")
        require(self.speculation == "always" or self.gamma in ("auto", "auto_simple"), "speculation",
                self.speculation, "'always' unless gamma is 'auto' or 'auto_simple' (its cost model gives break-even)")
        require(
            isinstance(self.max_batch_size, int) and self.max_batch_size >= 1,
            "max_batch_size", self.max_batch_size, "an int >= 1",
        )
        require(
            isinstance(self.max_seq_len, int) and self.max_seq_len >= 2,
            "max_seq_len", self.max_seq_len, "an int >= 2",
        )
        require(
            self.gamma in ("auto", "auto_simple") or (isinstance(self.gamma, int) and self.gamma >= 0),
            "gamma", self.gamma, "an int >= 0 (0 = plain decoding), 'auto' or 'auto_simple'",
        )
        require(
            isinstance(self.max_gamma, int) and self.max_gamma >= 1, "max_gamma", self.max_gamma,
            "an int >= 1",
        )
        if isinstance(self.gamma, int) and self.gamma > self.max_gamma:
            self.max_gamma = self.gamma
        if isinstance(self.dtype, str):
            resolved = getattr(torch, self.dtype, None)
            require(
                isinstance(resolved, torch.dtype) and resolved.is_floating_point, "dtype", self.dtype,
                "a floating torch dtype name such as 'float32', 'bfloat16', 'float16'",
            )
            self.dtype = resolved
        require(
            isinstance(self.signal_top_k, int) and self.signal_top_k >= 1, "signal_top_k",
            self.signal_top_k, "an int >= 1",
        )
        require(
            0.0 <= self.acceptance_ema < 1.0, "acceptance_ema", self.acceptance_ema, "a number in [0, 1)"
        )
        require(isinstance(self.lean_forward, bool), "lean_forward", self.lean_forward, "True or False")
        require(isinstance(self.allow_unverified_architectures, bool), "allow_unverified_architectures",
                self.allow_unverified_architectures, "True or False")
        require(
            isinstance(self.stats_trace_steps, int) and not isinstance(self.stats_trace_steps, bool)
            and self.stats_trace_steps >= 1, "stats_trace_steps", self.stats_trace_steps, "an int >= 1",
        )
        require(self.sampler in SAMPLER_NAMES, "sampler", self.sampler, "'rejection' or 'invariant'")
        if self.drafters is not None:
            self._check_drafters()
        require(self.layer_skip_layers is None or (isinstance(self.layer_skip_layers, int)
                and not isinstance(self.layer_skip_layers, bool) and self.layer_skip_layers >= 1),
                "layer_skip_layers", self.layer_skip_layers, "None (half the target's layers) or an int >= 1")
        require(self.eagle_intermediate_size is None or (isinstance(self.eagle_intermediate_size, int)
                and not isinstance(self.eagle_intermediate_size, bool) and self.eagle_intermediate_size >= 1),
                "eagle_intermediate_size", self.eagle_intermediate_size, "None (the target's MLP width) or an int >= 1")
        require(isinstance(self.medusa_heads, int) and not isinstance(self.medusa_heads, bool)
                and self.medusa_heads >= 1, "medusa_heads", self.medusa_heads, "an int >= 1")
        if self.eagle3_layers is not None:
            self.eagle3_layers = tuple(self.eagle3_layers)
            layers = self.eagle3_layers
            require(len(layers) >= 1 and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
                    and list(layers) == sorted(set(layers)) and layers[0] >= 0, "eagle3_layers", layers,
                    "None (low / middle / high) or distinct sorted target layer ids >= 0")
        require(isinstance(self.eagle3_ttt_steps, int) and not isinstance(self.eagle3_ttt_steps, bool)
                and self.eagle3_ttt_steps >= 1, "eagle3_ttt_steps", self.eagle3_ttt_steps, "an int >= 1")
        self._check_block()
        self._check_recurrent()
        require(self.draft_vocab is None or (isinstance(self.draft_vocab, int)
                and not isinstance(self.draft_vocab, bool) and self.draft_vocab >= 1), "draft_vocab", self.draft_vocab,
                "None (the whole vocabulary) or an int >= 1 (token ids the drafter drafts over)")
        require(isinstance(self.suffix, SuffixConfig), "suffix", self.suffix, "a SuffixConfig")
        require(self.kv_cache in KV_CACHE_KINDS, "kv_cache", self.kv_cache, "'dense' or 'paged'")
        require(isinstance(self.kv_block_size, int) and not isinstance(self.kv_block_size, bool)
                and self.kv_block_size >= 1, "kv_block_size", self.kv_block_size, "an int >= 1 (tokens per block)")
        require(self.prefill_chunk_tokens is None or (isinstance(self.prefill_chunk_tokens, int)
                and not isinstance(self.prefill_chunk_tokens, bool) and self.prefill_chunk_tokens >= 1),
                "prefill_chunk_tokens", self.prefill_chunk_tokens, "None (unchunked) or an int >= 1")
        require(isinstance(self.max_tree_width, int) and not isinstance(self.max_tree_width, bool)
                and 1 <= self.max_tree_width <= MAX_TREE_WIDTH, "max_tree_width", self.max_tree_width,
                f"an int in [1, {MAX_TREE_WIDTH}]")
        width = self.tree_width
        require(width == "auto" or (isinstance(width, int) and not isinstance(width, bool)
                and 1 <= width <= MAX_TREE_WIDTH), "tree_width", width,
                f"an int in [1, {MAX_TREE_WIDTH}] (1 = chains; w >= 2: trees of w nodes per level) or 'auto'")
        require(width != "auto" or self.gamma == "auto", "tree_width", width,
                f"'auto' needs gamma='auto' (the cost model shapes the tree), not gamma={self.gamma!r}")
        if isinstance(width, int) and width > self.max_tree_width:
            self.max_tree_width = width
        budget = self.memory_budget
        require(budget is None or (isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1)
                or (isinstance(budget, float) and 0 < budget <= 1), "memory_budget", budget,
                "None (no budget), an int >= 1 (bytes) or a float in (0, 1] (that share of the device's memory)")
        require(self.cost_model_budget_s > 0, "cost_model_budget_s", self.cost_model_budget_s, "> 0")
        try:
            torch.device(self.device)
        except RuntimeError as err:
            raise ValueError(f"device={self.device!r} is invalid: {err}") from err
        self._check_placement()

    def _check_placement(self) -> None:
        """`drafter_device` (its syntax; its cores are checked when the engine is built) and `overlap`: for chains of
        the drafter LM."""
        if self.drafter_device is not None:
            parse_drafter_device(self.drafter_device)
        require(isinstance(self.overlap, bool) or self.overlap == "auto", "overlap", self.overlap,
                "True, False or 'auto' (drafting ahead where measured steps say it pays)")
        if self.drafter_device is None and not self.overlap:
            return
        require(self.tree_width == 1, "tree_width", self.tree_width,
                "1 (chains) with drafter_device or overlap: trees are not placed apart or drafted ahead")
        require(self.drafters is None or tuple(self.drafters) == ("model",), "drafters", self.drafters,
                "None or ('model',) with drafter_device or overlap: they serve the drafter LM only")

    def _check_drafters(self) -> None:
        """`drafters`: registered kinds (an alias becomes its kind), distinct, at most one that runs a model."""
        kinds = tuple(self.drafters)
        self.drafters = tuple(DRAFTER_SPECS[k].kind if isinstance(k, str) and k in DRAFTER_SPECS else k for k in kinds)
        require(len(self.drafters) >= 1 and all(isinstance(k, str) and k in DRAFTER_SPECS for k in kinds)
                and len(set(self.drafters)) == len(self.drafters), "drafters", kinds,
                f"None or a non-empty list of distinct kinds from {sorted(DRAFTER_SPECS)}")
        runs_model = sorted(k for k, spec in DRAFTER_SPECS.items() if not spec.model_free and spec.kind == k)
        require(sum(not DRAFTER_SPECS[k].model_free for k in self.drafters) <= 1, "drafters", self.drafters,
                f"at most one of {runs_model} (with or without a model-free kind: "
                f"{sorted(k for k, spec in DRAFTER_SPECS.items() if spec.model_free)})")

    def _check_block(self) -> None:
        require(isinstance(self.block_size, int) and not isinstance(self.block_size, bool) and self.block_size >= 2,
                "block_size", self.block_size, "an int >= 2 (the anchor and at least one mask position)")
        layers = self.block_layers = None if self.block_layers is None else tuple(self.block_layers)
        require(layers is None or (len(layers) >= 1 and all(isinstance(i, int) and not isinstance(i, bool) for i in
                layers) and list(layers) == sorted(set(layers)) and layers[0] >= 0), "block_layers", layers,
                "None (spread over the target) or distinct sorted target layer ids >= 0")
        if self.drafters is not None and "block" in self.drafters:
            most = self.block_size - 1  # drafts one block forward gives
            require(not isinstance(self.gamma, int) or self.gamma <= most, "gamma", self.gamma,
                    f"at most block_size - 1 = {most} with the block drafter (or 'auto')")
            self.max_gamma = min(self.max_gamma, most)

    def _check_recurrent(self) -> None:
        for name, least in (("recurrent_mlp_layers", 0), ("recurrent_depths", 1)):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= least, name, value,
                    f"an int >= {least}")
        require(isinstance(self.recurrent_own_head, bool), "recurrent_own_head", self.recurrent_own_head, "a bool")
        require(not self.recurrent_own_head or self.draft_vocab is not None, "recurrent_own_head",
                self.recurrent_own_head, "False unless draft_vocab is set (the own LM head's rows are its ids)")

    @property
    def max_step_drafts(self) -> int:
        """The most draft tokens one step feeds per row: γ, or γ levels of a tree's nodes."""
        return self.max_gamma * (self.max_tree_width if self.tree_width == "auto" else self.tree_width)

    @property
    def cache_len(self) -> int:
        """Slots per row in the KV buffers: room for the longest row plus one step of drafts."""
        return self.max_seq_len + self.max_step_drafts + 2

    @property
    def state_history(self) -> int:
        """Lengths a recurrent layer's per-row state is kept at (`models.cache.RaggedKVCache`): a step rolls a
        row back by at most `max_gamma` of the γ + 1 tokens it fed."""
        return self.max_gamma + 1
