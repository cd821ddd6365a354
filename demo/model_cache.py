"""The demo models on disk: build once, cache under `SPECROLL_CACHE`, load in seconds afterwards.

Usage::

    models = load_or_build_demo_models()             # full recipe; builds on first use
    models = load_or_build_demo_models(DemoRecipe.tiny(), cache_dir=tmp_path)   # tests
    engine = SpecEngine(models.target, models.drafter, EngineConfig(gamma=4))

The cache folder is `$SPECROLL_CACHE` (default `~/.cache/specroll`) / `demo-<recipe hash>`, holding
`target/`, `drafter/`, `tokenizer/` (each written by `save_pretrained`) and `recipe.json`. A build is
written to a temporary sibling folder and renamed into place, and `recipe.json` is its last file, so
an interrupted build is never mistaken for a finished one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from .build import build
from .recipe import DemoRecipe

MANIFEST = "recipe.json"


@dataclass
class DemoModels:
    """The demo's target, drafter and tokenizer (fp32, eval mode), and where they were loaded from."""

    target: LlamaForCausalLM
    drafter: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerFast
    path: Path
    recipe: DemoRecipe
    build_log: dict


def default_cache_dir() -> Path:
    """`$SPECROLL_CACHE`, else `~/.cache/specroll`."""
    return Path(os.environ.get("SPECROLL_CACHE") or Path.home() / ".cache" / "specroll").expanduser()


def models_dir(recipe: DemoRecipe | None = None, cache_dir: str | Path | None = None) -> Path:
    """Where `recipe`'s models live: `<cache_dir>/demo-<recipe hash>`."""
    recipe = recipe or DemoRecipe()
    return Path(cache_dir or default_cache_dir()).expanduser() / f"demo-{recipe.hash}"


def is_cached(recipe: DemoRecipe | None = None, cache_dir: str | Path | None = None) -> bool:
    """Whether `recipe`'s finished build is in the cache (loading it takes seconds, building it minutes)."""
    return (models_dir(recipe, cache_dir) / MANIFEST).is_file()


def load_or_build_demo_models(recipe: DemoRecipe | None = None, cache_dir: str | Path | None = None,
                              progress: bool = True) -> DemoModels:
    """Load `recipe`'s cached models, building them first if the cache lacks them."""
    return build_demo_models(recipe, cache_dir, progress, force=False)


def build_demo_models(recipe: DemoRecipe | None = None, cache_dir: str | Path | None = None,
                      progress: bool = True, force: bool = True) -> DemoModels:
    """Build `recipe`'s models into the cache (replacing a cached build when `force`), then load them."""
    recipe = recipe or DemoRecipe()
    if not isinstance(recipe, DemoRecipe):
        raise ValueError(f"recipe={recipe!r} is invalid: a DemoRecipe (or None for the full recipe) is required")
    path = models_dir(recipe, cache_dir)
    if force or not is_cached(recipe, cache_dir):
        _build_into(recipe, path, progress)
    return load_demo_models(path, recipe)


def load_demo_models(path: str | Path, recipe: DemoRecipe | None = None) -> DemoModels:
    """Load a finished build folder (one with `recipe.json`)."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise ValueError(f"path={str(path)!r} is invalid: no {MANIFEST} there (not a finished demo build)")
    info = json.loads(manifest.read_text())
    target = LlamaForCausalLM.from_pretrained(path / "target", dtype=torch.float32).eval()
    drafter = LlamaForCausalLM.from_pretrained(path / "drafter", dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path / "tokenizer")
    recipe = recipe or DemoRecipe.from_dict(info["recipe"])
    return DemoModels(target, drafter, tokenizer, path, recipe, info.get("build_log", {}))


def _build_into(recipe: DemoRecipe, path: Path, progress: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    result = build(recipe, progress=progress)
    staging = Path(tempfile.mkdtemp(prefix=f"{path.name}.tmp-", dir=path.parent))
    try:
        result.target.save_pretrained(staging / "target")
        result.drafter.save_pretrained(staging / "drafter")
        result.tokenizer.save_pretrained(staging / "tokenizer")
        manifest = {"recipe": recipe.to_dict(), "hash": recipe.hash, "build_log": result.log}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
