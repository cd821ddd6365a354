"""The contenders of `long_tail`: one engine per drafter kind and γ, trained heads where cached, lockstep groups.

Every engine holds a KV cache of slots × max_seq_len for its target (4.3 GB for the demo target at the workload's
defaults), so the engines of one lockstep group must fit in memory together: `group_size` sizes the groups to the
memory available, and `lockstep_groups` puts plain decoding in every group, so each ratio to plain is paired within
a group. The demo models were trained to fewer positions than the workload needs: `extend_positions` raises their
configs' `max_position_embeddings` (RoPE then runs past its trained length, extrapolated). This module imports
nothing heavy at the top.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from specroll.rollout import SpecEngine

    from .models import BenchModels

# Contender kind → `EngineConfig.drafters` (None: plain decoding).
KINDS = {"plain": None, "model": ("model",), "suffix": ("suffix",), "suffix+model": ("suffix", "model"),
         "layer_skip": ("layer_skip",), "eagle": ("eagle",), "medusa": ("medusa",)}
HEADS = ("eagle", "medusa")
MEMORY_SHARE = 0.75  # of the memory available, what the engines of one lockstep group may take
# An engine's memory over its target's KV cache (the drafter's cache, activations), measured at the defaults on
# demo-shaped models: 1.00 layer-skip, 1.02 plain decoding, 1.09 the drafter LM (with or without suffix), 1.20 EAGLE.
ENGINE_OVERHEAD = 1.1


@dataclass(frozen=True)
class Contender:
    """One engine setting of the race: its drafter kind (`KINDS`) and γ."""

    name: str
    kind: str
    gamma: int | str
    tree_width: int | str = 1  # "auto": token trees where the cost model finds they pay (`EngineConfig.tree_width`)
    max_tree_width: int = 4


@dataclass
class Engines:
    """Builds a fresh engine of any contender on the same models, heads and shape."""

    models: BenchModels
    heads: dict
    slots: int
    max_seq_len: int
    layer_skip: int | None
    sampler: str

    def build(self, c: Contender) -> SpecEngine:
        from specroll.rollout import EngineConfig, SpecEngine

        drafters = KINDS[c.kind]
        config = EngineConfig(max_batch_size=self.slots, max_seq_len=self.max_seq_len, gamma=c.gamma,
                              drafters=drafters, sampler=self.sampler, layer_skip_layers=self.layer_skip,
                              stats_trace_steps=1, tree_width=c.tree_width, max_tree_width=c.max_tree_width)
        weights = self.models.drafter if drafters and "model" in drafters else self.heads.get(c.kind)
        return SpecEngine(self.models.target, weights, config)

    def warm_up(self, contenders: list[Contender], prompt: list[int]) -> None:
        """Untimed first calls: each auto engine's calibration (cached on disk), lazy init, the allocator."""
        from specroll.rollout import SamplingParams

        for c in contenders:
            self.build(c).generate([prompt], SamplingParams(max_new_tokens=4, seed=0))
            gc.collect()  # one engine's KV cache at a time


@contextmanager
def collecting_engines() -> Iterator[None]:
    """An engine's KV cache sits in a reference cycle (the cache and its layers), so only a collection frees it:
    what is loaded before is frozen out of the collections inside (`gc.freeze`), so each scans little more than the
    engines (a full one took ~0.4 s with the models loaded)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def kv_cache_bytes(model: torch.nn.Module, slots: int, cache_len: int) -> int:
    """The target's K/V buffers at `slots` × `cache_len` (attention layers of the config's shape)."""
    config = model.config.get_text_config()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    width = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * heads * head_dim * slots * cache_len * width


def memory_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def lockstep_groups(contenders: list[Contender], per_group: int) -> list[list[Contender]]:
    """The speculative contenders `per_group` at a time, plain first in every group."""
    plain, rest = contenders[0], contenders[1:]
    return [[plain, *rest[i : i + per_group]] for i in range(0, len(rest), per_group)] or [[plain]]


def group_size(requested: int, speculative: int, engine_bytes: float) -> int:
    """Speculative contenders per lockstep group: `requested` if not 0, else as many as fit, with plain, in
    `MEMORY_SHARE` of the memory available (all of them where that is unknown), at least one."""
    if requested:
        return requested
    available = memory_available()
    if available is None:
        return speculative
    return max(1, min(speculative, int(MEMORY_SHARE * available / engine_bytes) - 1))


def extend_positions(models: BenchModels, max_seq_len: int) -> int:
    """Raise the models' `max_position_embeddings` to `max_seq_len` (positions past it run on RoPE's formula,
    extrapolated); returns the target's trained length."""
    trained = models.target.config.max_position_embeddings
    for model in (models.target, models.drafter):
        model.config.max_position_embeddings = max(model.config.max_position_embeddings, max_seq_len)
    return trained


def trained_heads(models: BenchModels, kinds: tuple[str, ...], fresh: bool) -> tuple[dict, dict[str, str]]:
    """({kind: head weights}, {kind: why skipped}): trained heads from the cache beside the demo models; with
    `fresh` (the tiny smoke run) untrained ones, for the heads the cache lacks."""
    wanted = [k for k in kinds if k in HEADS]
    if not wanted:
        return {}, {}
    from specroll.demo.heads import heads_dir, load_or_train_heads

    folder = heads_dir(models.path) if models.path is not None else None
    cached = tuple(k for k in wanted if folder is not None and (folder / f"{k}.pt").is_file())
    heads = load_or_train_heads(models.target, [], models.stop_token_ids, models.path, names=cached) if cached else {}
    skipped = {}
    for kind in wanted:
        if kind in heads:
            continue
        if fresh:
            heads[kind] = None  # the engine starts a fresh head
        else:
            skipped[kind] = (f"no trained head in {folder} (for `--models demo`, `python -m "
                             "specroll.demo.heads` trains them: ~25 min)")
    return heads, skipped
