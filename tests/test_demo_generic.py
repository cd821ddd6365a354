"""The demo's generic drafter (`demo.generic`): a separate cached artifact beside the demo models, never their
recipe's hash; `configs/demo_generic.yaml` warm-starts the main job from it (run here at the tiny recipe)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import yaml

from specroll.demo.generic import MANIFEST, generic_dir, load_or_build_generic_drafter
from specroll.demo.model_cache import load_or_build_demo_models, models_dir
from specroll.demo.recipe import DemoRecipe
from specroll.jobs.train_config import ModelsConfig
from specroll.rollout.models.vocab import check_vocab_compatible

REPO = Path(__file__).resolve().parents[1]


def test_generic_drafter_is_built_once_beside_the_demo_models(tiny_demo_cache, capsys):
    demo = load_or_build_demo_models(DemoRecipe.tiny(), cache_dir=tiny_demo_cache, progress=False)
    path = load_or_build_generic_drafter(demo, progress=False)
    assert path == generic_dir(demo) and path.parent == demo.path.parent and (path / MANIFEST).is_file()
    assert demo.path == models_dir(DemoRecipe.tiny(), tiny_demo_cache)  # the demo models' folder is as it was
    capsys.readouterr()
    assert load_or_build_generic_drafter(demo, progress=False) == path
    assert "building" not in capsys.readouterr().out  # cached: the second call loads
    from transformers import AutoModelForCausalLM, AutoTokenizer

    generic = AutoModelForCausalLM.from_pretrained(path)
    check_vocab_compatible(demo.target, generic, demo.tokenizer, AutoTokenizer.from_pretrained(path))
    assert generic.config.num_hidden_layers == demo.recipe.drafter.num_layers
    recipe = demo.recipe  # the demo drafter's whole training budget: the core's SFT it was cut from, its own stages
    built = json.loads((path / MANIFEST).read_text())
    assert built["steps"] == recipe.core_sft.steps + recipe.drafter_sft.steps + recipe.drafter_distill.steps
    # never the demo drafter (cut from the target's core and distilled on its samples): other weights
    distilled = demo.drafter.state_dict()
    assert any(not torch.equal(t, distilled[name]) for name, t in generic.state_dict().items() if name in distilled)


def test_models_drafter_for_the_demo_is_generic_or_null():
    assert ModelsConfig(drafter="generic").drafter == "generic"
    with pytest.raises(ValueError, match=r"models\.drafter='/some/folder' is invalid"):
        ModelsConfig(drafter="/some/folder")


def test_demo_generic_preset_runs_at_the_tiny_recipe(tiny_demo_cache, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from specroll.jobs import train

    preset = yaml.safe_load((REPO / "configs" / "demo_generic.yaml").read_text())
    assert preset["models"] == {"source": "demo", "recipe": "bpe", "drafter": "generic"}
    preset["models"]["recipe"] = "tiny"  # the subword world's models take minutes to build
    preset.update(grpo={"steps": 2, "prompts_per_step": 2, "num_generations": 2, "max_completion_length": 16,
                        "num_train_prompts": 8},
                  backend={"kind": "local"}, probe={"prompts": 2, "samples": 1, "every": 1},
                  report={"out_dir": str(tmp_path / "report"), "speed_prompts": 2, "speed_repeats": 1})
    preset["engine"].update(max_batch_size=4, max_seq_len=96, cost_model_budget_s=0.3, draft_vocab=16,
                            calibration_cache=str(tmp_path / "calibration"))  # the tiny vocabulary: ~40 ids
    preset["learner"].update(max_steps=2, batch_size=4)
    config = tmp_path / "generic.yaml"
    config.write_text(yaml.safe_dump(preset))
    monkeypatch.setenv("SPECROLL_CACHE", str(tiny_demo_cache))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "report" / "tensorboard"))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    assert train.run(argparse.Namespace(config=str(config), out_dir=None)) == 0
    resolved = yaml.safe_load((tmp_path / "report" / "config.yaml").read_text())
    assert resolved["models"]["drafter"] == "generic"
    probes = [json.loads(line) for line in (tmp_path / "report" / "probes.jsonl").read_text().splitlines()]
    assert probes and all("drafter/probe_frozen" in p for p in probes)


def test_build_demo_models_builds_the_generic_drafter_on_request(tiny_demo_cache, capsys):
    from specroll.cli import main

    argv = ["build-demo-models", "--tiny", "--cache-dir", str(tiny_demo_cache), "--no-progress", "--threads", "1"]
    assert main(argv) == 0
    assert "generic drafter" not in capsys.readouterr().out
    assert main([*argv, "--generic"]) == 0
    demo = load_or_build_demo_models(DemoRecipe.tiny(), cache_dir=tiny_demo_cache, progress=False)
    assert f"generic drafter at {generic_dir(demo)}" in capsys.readouterr().out
    assert (generic_dir(demo) / MANIFEST).is_file()
