"""`specroll train` configs: the shipped ones load; bad ones fail at load, naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from specroll.jobs.train_config import TrainConfig, load_train_config, resolved_dict

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", sorted(path.name for path in CONFIGS.glob("*.yaml")))
def test_shipped_configs_load(name):
    config = load_train_config(CONFIGS / name)
    assert isinstance(config, TrainConfig)
    assert resolved_dict(config)["grpo"]["steps"] == config.grpo.steps


def test_the_frozen_vocabulary_arm_is_the_main_job_but_for_its_subset():
    """configs/demo_frozen_vocab.yaml is compared with the main job paired (`tools.probe_compare`): only
    `learner.draft_vocab_updates` (and where the report goes) may differ."""
    main, arm = (resolved_dict(load_train_config(CONFIGS / name)) for name in ("demo.yaml", "demo_frozen_vocab.yaml"))
    assert main["learner"].pop("draft_vocab_updates") is True and arm["learner"].pop("draft_vocab_updates") is False
    main["report"].pop("out_dir"), arm["report"].pop("out_dir")
    assert main == arm


def test_the_trees_arm_is_the_main_job_but_for_its_trees():
    """configs/demo_trees.yaml takes turns with the main job (`tools.interleave`): only the tree settings
    may differ, so the pair's rollouts, rewards and policy are one GRPO run's (the invariant sampler)."""
    main, arm = (resolved_dict(load_train_config(CONFIGS / name)) for name in ("demo.yaml", "demo_trees.yaml"))
    assert (main["engine"].pop("tree_width"), arm["engine"].pop("tree_width")) == (1, "auto")
    assert arm["engine"].pop("max_tree_width") == 3
    main["engine"].pop("max_tree_width")
    assert main == arm and main["engine"]["sampler"] == "invariant"


def test_the_recurrent_arm_is_the_main_job_but_for_its_drafter():
    """configs/demo_recurrent.yaml runs in the main job's world: only the drafter, its trees, the learning rate of a
    head from nothing and where the report goes differ."""
    main, arm = (resolved_dict(load_train_config(CONFIGS / name)) for name in ("demo.yaml", "demo_recurrent.yaml"))
    assert list(arm["engine"].pop("drafters")) == ["recurrent"] and main["engine"].pop("drafters") is None
    assert (arm["engine"].pop("tree_width"), arm["engine"].pop("max_tree_width")) == ("auto", 3)
    main["engine"].pop("tree_width"), main["engine"].pop("max_tree_width")
    assert (main["learner"].pop("lr"), arm["learner"].pop("lr")) == (2e-4, 1e-3)
    assert main == arm


@pytest.mark.parametrize(("data", "field"), [
    ({"grpo": {"stepz": 3}}, "stepz"),
    ({"grpo": {"num_generations": 1}}, "grpo.num_generations"),
    ({"backend": {"kind": "slurm"}}, "backend.kind"),
    ({"backend": {"topology": {"num_workerz": 2}}}, "num_workerz"),
    ({"engine": {"gamma": -1}}, "gamma"),
    ({"models": {"source": "pretrained"}}, "models.target"),
    ({"report": {"speed_prompts": 0}}, "report.speed_prompts"),
    ({"grpo": {"max_completion_length": 512}, "engine": {"max_seq_len": 256}}, "engine.max_seq_len"),
    ({"unknown_section": {}}, "unknown_section"),
    ({"learner": {"max_stepz": 3}}, "learner"),
    ({"grpo": {"extra": {"not_a_grpo_field": 1}}}, "grpo.extra"),
])
def test_bad_config_fails_at_load_naming_the_field(tmp_path, data, field):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=field):
        load_train_config(path)


def test_gpu_preset_describes_eight_gpus_and_a_zero3_trainer():
    config = load_train_config(CONFIGS / "gpu_qwen2.5_7b.yaml")
    topo = config.backend.topology
    trainer_gpus = 1
    assert topo.num_workers * topo.worker.num_gpus + topo.learner.num_gpus + trainer_gpus == 8
    ds = json.loads((CONFIGS.parent / config.grpo.deepspeed).read_text())
    assert ds["zero_optimization"]["stage"] == 3
    assert config.engine.dtype == torch.bfloat16 and config.grpo.bf16
