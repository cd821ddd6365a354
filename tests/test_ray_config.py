"""The YAML loader and the Ray run config: unknown fields and bad values fail at load, by name."""

from __future__ import annotations

import pytest

from specroll.integrations.ray_backend.settings import RayRunConfig, SyncConfig, TopologyConfig
from specroll.integrations.yaml_config import from_dict, load_config


def test_loader_builds_nested_dataclasses(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "models: {target: /m/t, drafter: /m/d}\n"
        "topology: {num_workers: 2, worker: {num_cpus: 0.5}}\n"
        "engine: {max_batch_size: 4, gamma: 2, dtype: float32}\n"
        "sampling: {max_new_tokens: 8, temperature: 0.0, stop_token_ids: [1]}\n"
    )
    config = load_config(path, RayRunConfig)
    assert config.topology.num_workers == 2 and config.topology.worker.num_cpus == 0.5
    assert config.engine.gamma == 2 and config.sampling.stop_token_ids == (1,)
    assert config.sync.transport == "object_store"


def test_loader_names_unknown_fields():
    with pytest.raises(ValueError, match=r"topology has unknown fields \['num_wrokers'\]"):
        from_dict(RayRunConfig, {"models": {"target": "t"}, "topology": {"num_wrokers": 2}})


def test_config_values_are_validated():
    with pytest.raises(ValueError, match=r"sync\.transport='carrier_pigeon'"):
        SyncConfig(transport="carrier_pigeon")
    with pytest.raises(ValueError, match="placement_strategy='DIAGONAL'"):
        TopologyConfig(placement_strategy="DIAGONAL")
