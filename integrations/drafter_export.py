"""The drafter a run ends with, written in the layout the ecosystem loads its kind in — and specroll's `models:`.

    drafter = final_drafter(paths, engine_config, target, backend.published_drafter())
    exported = export_drafter(drafter, "eagle3", target, "out/drafter", tokenizer, verifier="out/policy")
    print(exported.models_yaml("out/policy"))     # the `models:` / `engine:` sections that serve it again

By kind (`model_source.trained_drafter_kind`):

- a drafter LM ("model"): a Hugging Face folder (`save_pretrained` and its tokenizer): `from_pretrained`,
  `vllm serve --speculative-config '{"model": ...}'`, `models.drafter`;
- "eagle3": the speculators layout (`eagle3_checkpoint.save_eagle3_checkpoint`), which vLLM serves as
  `"method": "eagle3"` and `models.head` reads back;
- "block" (DFlash): the speculators layout (`block_checkpoint.save_block_checkpoint`, vLLM's `"method": "dflash"`)
  in `folder`, and z-lab's beside it in `<folder>_zlab`; `models.head` reads either;
- "eagle" / "medusa" / "recurrent": specroll's own heads, whose shapes no public loader takes: their state dict in
  `<folder>/<kind>.pt` with the draft vocabulary they were trained over (`models.head`; a recurrent head with its own
  LM head: that head's ids).

A head trained over a draft vocabulary keeps it: the speculators layouts as `d2t` / `t2d`, a `.pt` file in its own
entry (`head_file`); `models_yaml` then sets `engine.draft_vocab` to its size. A drafter LM's draft vocabulary
is the serving engine's setting (`engine.draft_vocab`), not the model's: its folder is the plain LM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from specroll.rollout import EngineConfig
from specroll.rollout.drafters.draft_vocab import CARRIED_ATTR, carry
from specroll.rollout.drafters.version import DrafterVersion
from specroll.rollout.models.weights import copy_into

from .formats.dflash import SPECULATORS, ZLAB, save_block_checkpoint
from .formats.eagle3 import save_eagle3_checkpoint
from .head_file import save_head_file
from .model_source import ModelPaths, load_drafter, trained_drafter_kind

EXPORTED_KINDS = ("model", "eagle3", "block", "eagle", "medusa", "recurrent")


@dataclass
class ExportedDrafter:
    """Where a drafter was written: `path` is what `models.drafter` (a drafter LM) or `models.head` (a head)
    takes; `layouts` each layout written and its path; `engine` the `engine:` fields that serve it."""

    kind: str
    path: Path
    layouts: dict[str, Path] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)

    def models_yaml(self, target: str | Path) -> str:
        """The `models:` and `engine:` sections of a `specroll train` config that serve this drafter with `target`."""
        where = "drafter" if self.kind == "model" else "head"
        engine = ", ".join(f"{k}: {v}" for k, v in {"drafters": f"[{self.kind}]", **self.engine}.items())
        return f"models: {{source: pretrained, target: {target}, {where}: {self.path}}}\nengine: {{{engine}}}\n"


def final_drafter(paths: ModelPaths, engine: EngineConfig, target: PreTrainedModel,
                  published: DrafterVersion | None) -> Any | None:
    """The drafter a run serves at its end: the one `models:` names (`load_drafter`), holding `published` (the
    learner's published version, with its draft vocabulary, if any; None without a learner: as loaded). None
    for a kind with no weights (suffix, layer-skip)."""
    drafter = load_drafter(paths, engine, target)
    if drafter is None or published is None:
        return drafter
    copy_into(drafter, published.weights, "the published drafter")
    return carry(drafter, published.draft_vocab) if published.draft_vocab is not None else drafter


def export_drafter(drafter: Any, kind: str, target: PreTrainedModel, folder: str | Path, tokenizer: Any = None,
                   verifier: str | None = None, engine: EngineConfig | None = None) -> ExportedDrafter:
    """Write `drafter` (of `kind`, one of `EXPORTED_KINDS`) under `folder` as the module doc says; `tokenizer` goes
    with a drafter LM, `verifier` (the target's folder) into the speculators configs, and `engine` (the run's)
    gives the `engine:` fields a `.pt` head needs (`medusa_heads`)."""
    if kind not in EXPORTED_KINDS:
        raise ValueError(f"kind={kind!r} is invalid: one of {EXPORTED_KINDS} (a drafter with weights)")
    folder = Path(folder)
    ids = getattr(drafter, CARRIED_ATTR, None)
    vocab = {} if ids is None else {"draft_vocab": int(ids.numel())}
    if kind == "model":
        drafter.save_pretrained(folder)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        return ExportedDrafter(kind, folder, {"huggingface": folder})
    if kind == "eagle3":
        save_eagle3_checkpoint(drafter, target, folder, verifier)
        return ExportedDrafter(kind, folder, {SPECULATORS: folder})
    if kind == "block":
        zlab = folder.with_name(f"{folder.name}_zlab")
        save_block_checkpoint(drafter, target, folder, SPECULATORS, verifier)
        save_block_checkpoint(drafter, target, zlab, ZLAB)
        return ExportedDrafter(kind, folder, {SPECULATORS: folder, ZLAB: zlab},
                               {"block_size": drafter.block_size, **vocab})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}.pt"
    heads = {"medusa_heads": engine.medusa_heads} if kind == "medusa" and engine is not None else {}
    if kind == "recurrent":
        heads = {"recurrent_mlp_layers": len(drafter.blocks)}
        if drafter.lm_head is not None:  # its own LM head's rows are its ids: the file carries those
            ids = drafter.draft_ids.cpu()
            vocab = {"draft_vocab": int(ids.numel()), "recurrent_own_head": True}
    save_head_file(path, drafter, ids)
    return ExportedDrafter(kind, path, {"specroll": path}, {**heads, **vocab})


def export_run_drafter(paths: ModelPaths, engine: EngineConfig, target: PreTrainedModel,
                       published: DrafterVersion | None, folder: str | Path, tokenizer: Any = None,
                       verifier: str | None = None) -> ExportedDrafter | None:
    """`final_drafter` written by `export_drafter` (its kind: `trained_drafter_kind`); None when the run's drafter
    has no weights to keep."""
    kind = trained_drafter_kind(paths, engine)
    drafter = final_drafter(paths, engine, target, published) if kind is not None else None
    if drafter is None:
        return None
    return export_drafter(drafter, kind, target, folder, tokenizer, verifier, engine)
