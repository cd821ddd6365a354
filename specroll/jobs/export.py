"""`specroll export RUN`: a run's checkpoint as the files the ecosystem loads — the policy and the drafter.

    specroll export specroll_report                       # its newest whole checkpoint → <checkpoint>/export/
    specroll export specroll_report/trainer/checkpoint-20 --out exported/

What `specroll train` keeps at its end (`checkpoint.final`), for any checkpoint a run left (`checkpoint.every`):
`<out>/policy` (the checkpoint's policy and tokenizer, `save_pretrained`) and `<out>/drafter` — the drafter the
learner had published at that step, in its kind's layout (`integrations.drafter_export`: a Hugging Face folder for
a drafter LM, the speculators layout for EAGLE-3 and DFlash heads, z-lab's too for DFlash). Which drafter and
models the run had comes from the checkpoint itself (`resume.fingerprint`: the models section and the drafter's
engine fields), so the export needs no config file; the demo's models are found in the cache as the run found them.

Only argparse is imported at module level: `specroll export --help` answers before torch loads.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run's report folder (its newest whole checkpoint) or one of its "
                        "trainer/checkpoint-<step> folders")
    parser.add_argument("--out", default=None, help="where policy/ and drafter/ go (default: <checkpoint>/export)")


def run(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    from specroll.integrations.drafter_export import export_run_drafter
    from specroll.integrations.model_source import load_tokenizer

    from .backends import resolve_models
    from .checkpoints import find_checkpoint

    saved = find_checkpoint(args.run)
    config = run_config(saved.run["fingerprint"])
    sources = resolve_models(config)
    out = Path(args.out) if args.out else saved.path / "export"
    policy = AutoModelForCausalLM.from_pretrained(saved.path)
    tokenizer = load_tokenizer(str(saved.path)) or sources.tokenizer
    policy.save_pretrained(out / "policy")
    if tokenizer is not None:
        tokenizer.save_pretrained(out / "policy")
    exported = export_run_drafter(sources.paths, config.engine, policy, published_drafter(saved.backend_state()),
                                  out / "drafter", load_tokenizer(sources.paths.drafter_tokenizer
                                                                  or sources.paths.drafter),
                                  verifier=str((out / "policy").resolve()))
    logger.info(f"specroll export: step {saved.step}'s policy (and tokenizer) in {out / 'policy'}")
    if exported is None:
        logger.info("specroll export: the run's drafter has no weights to keep (suffix / layer-skip drafting)")
    else:
        layouts = ", ".join(f"{name}: {path}" for name, path in exported.layouts.items())
        logger.info(f"specroll export: its {exported.kind} drafter in {layouts}; to serve both again:\n"
                    + exported.models_yaml(out / "policy"))
    return 0


def run_config(fingerprint: dict[str, Any]) -> Any:
    """A `TrainConfig` with the models and drafter engine fields a checkpoint was made with (its `fingerprint`;
    the rest defaults: they do not decide what the drafter is)."""
    from specroll.integrations.yaml_config import from_dict

    from .train_config import TrainConfig

    sections: dict[str, dict[str, Any]] = {"models": {}, "engine": {}}
    for name, value in fingerprint.items():
        section, _, field = name.partition(".")
        if section in sections:
            sections[section][field] = value
    return from_dict(TrainConfig, sections)


def published_drafter(backend_state: dict[str, Any]) -> dict[str, Any] | None:
    """The learner's published drafter in a checkpoint's backend state (`online_drafter.learner_state`), with its
    draft vocabulary; None without a learner (the run served the drafter it loaded)."""
    from specroll.rollout.drafters.draft_vocab import STATE_KEY

    learner = backend_state.get("learner")
    if learner is None:
        return None
    vocab = learner.get("draft_vocab")
    return {**learner["published"], **({} if vocab is None else {STATE_KEY: vocab["published"]})}
