"""The Ray part of a run config: one YAML means the same to `specroll train` and the Ray job (both load
a `TrainConfig`); unknown fields and bad values fail at load, by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from specroll.integrations.ray_backend.settings import SyncConfig, TopologyConfig
from specroll.integrations.yaml_config import ConfigError
from specroll.jobs.train_config import load_train_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_the_ray_job_preset_is_a_run_config():
    config = load_train_config(CONFIGS / "ray_local.yaml")
    assert config.backend.kind == "ray" and config.models.source == "pretrained"
    assert config.backend.topology.num_workers == 2 and config.backend.topology.worker.num_cpus == 0.5
    assert config.engine.gamma == 2 and not config.engine.record_signals  # the backend turns it on for its learner
    assert config.grpo.prompts_per_step * config.grpo.num_generations == 8


def test_loader_names_unknown_fields(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("backend: {topology: {num_wrokers: 2}}\n")
    with pytest.raises(ConfigError, match=r"backend\.topology has unknown fields \['num_wrokers'\]"):
        load_train_config(path)


def test_config_values_are_validated():
    with pytest.raises(ValueError, match=r"sync\.transport='carrier_pigeon'"):
        SyncConfig(transport="carrier_pigeon")
    with pytest.raises(ValueError, match="placement_strategy='DIAGONAL'"):
        TopologyConfig(placement_strategy="DIAGONAL")
