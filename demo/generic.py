"""The demo's generic drafter: a small LM of the demo's tokenizer that never saw the target or its samples.

The demo build's own drafter is cut from the target's core and distilled on the target's samples: made for
that target. A user's drafter rarely is — the common warm start is a small model of the policy's family,
trained on the same kind of corpus but never on the policy's samples. This module makes the demo's stand-in
for it: the recipe's drafter shape from random weights, trained on the task's corpus alone (canonical
solutions in both styles, `build.sft_examples`, on a data stream of its own) for as many steps as the demo
drafter's weights had: the core's SFT (the demo drafter is cut from the core), its own SFT and its
distillation, at the core SFT's batch size and rate (a model from nothing). Its training budget is the demo
drafter's; only its data differ. Online learning then has to close the gap (`configs/demo_generic.yaml`:
`models: {source: demo, drafter: generic}`).

Version 1 trained only the drafter's own SFT and distillation steps: in the bpe world (no drafter SFT) that
was 120 steps from nothing, a model that had barely begun to learn the task; the character world's measured
runs of 2026-12-05 (docs/get_a_drafter.md) used version 1.

It is a separate cached artifact, built on first use beside the demo models and keyed by their folder (so
by their recipe's hash, which it leaves as it is): `<cache>/generic-<demo folder name>-v<GENERIC_VERSION>/`,
a `save_pretrained` folder; `build.json` is written last, so a build cut short is never loaded.

    path = load_or_build_generic_drafter(load_or_build_demo_models(DemoRecipe.tiny()))
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from .build import llama_config, sft_examples
from .model_cache import DemoModels
from .pretrain import train
from .recipe import DemoRecipe, TrainStage

logger = logging.getLogger(__name__)

GENERIC_VERSION = 2  # bump when what is built for the same demo models changes
GENERIC_SEED = 4  # its own problem stream (the build's are 1-3) and init seed offset
MANIFEST = "build.json"


def generic_dir(demo: DemoModels) -> Path:
    """Where the generic drafter of `demo`'s models lives (beside them, named after their folder)."""
    return demo.path.parent / f"generic-{demo.path.name}-v{GENERIC_VERSION}"


def generic_stage(recipe: DemoRecipe) -> TrainStage:
    """The generic drafter's one training stage: the demo drafter's steps, core SFT included."""
    steps = recipe.core_sft.steps + recipe.drafter_sft.steps + recipe.drafter_distill.steps
    return TrainStage(steps, recipe.core_sft.batch_size, recipe.core_sft.lr)


def is_built(demo: DemoModels) -> bool:
    return (generic_dir(demo) / MANIFEST).is_file()


def load_or_build_generic_drafter(demo: DemoModels, progress: bool = True) -> Path:
    """The generic drafter's folder for `demo` (a `save_pretrained` LM with the demo's tokenizer), built now,
    saying so, if it is not there yet."""
    path = generic_dir(demo)
    if is_built(demo):
        return path
    recipe = demo.recipe
    stage = generic_stage(recipe)
    steps = stage.steps
    logger.info(f"specroll: building the demo's generic drafter (first use only: {steps} training steps on the corpus "
          f"alone) into {path}")
    started = time.perf_counter()
    torch.manual_seed(recipe.seed + GENERIC_SEED)
    model = LlamaForCausalLM(llama_config(recipe.drafter, demo.tokenizer, recipe.max_position_embeddings))
    examples = sft_examples(recipe, demo.tokenizer, steps * stage.batch_size, GENERIC_SEED)
    log = train(model, examples, stage, demo.tokenizer.pad_token_id, seed=recipe.seed + GENERIC_SEED,
                desc="generic drafter", progress=progress, negatives=recipe.softmax_negatives)
    staging = Path(tempfile.mkdtemp(prefix=f"{path.name}.tmp-", dir=path.parent))
    try:
        model.eval().save_pretrained(staging)
        demo.tokenizer.save_pretrained(staging)
        (staging / MANIFEST).write_text(json.dumps({
            "demo_models": demo.path.name, "steps": steps, "seconds": round(time.perf_counter() - started, 1),
            "final_loss": round(sum(log.losses[-20:]) / max(1, len(log.losses[-20:])), 4)}, indent=1))
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return path
