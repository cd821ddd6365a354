"""The calibration cache is read like a checkpoint: a file cut short or not a cost model is a `ValueError` that
names it, never a bare JSON error or a silent re-measure."""

from __future__ import annotations

import json
import re

import pytest
from tiny_models import tiny_lm

from specroll.rollout import EngineConfig, SpecEngine
from specroll.rollout.gamma.calibration import calibrate


def cached(tmp_path):
    """An engine's target and drafter, and the one cache file their calibration wrote."""
    engine = SpecEngine(tiny_lm("llama"), tiny_lm("llama", layers=1), EngineConfig(max_batch_size=2, max_seq_len=64))
    calibrate(engine.target, engine.drafter, max_batch=2, max_gamma=2, budget_s=0.5, cache_dir=str(tmp_path))
    (path,) = [path for path in tmp_path.iterdir() if not path.stem.endswith("-sampling")]
    return engine, path


def calibrate_again(engine, tmp_path):
    return calibrate(engine.target, engine.drafter, max_batch=2, max_gamma=2, budget_s=0.5, cache_dir=str(tmp_path))


def test_truncated_cache_file_is_a_value_error_naming_it(tmp_path):
    engine, path = cached(tmp_path)
    path.write_text(path.read_text()[: len(path.read_text()) // 2])
    with pytest.raises(ValueError, match=re.escape(f"calibration cache {path} cannot be read")):
        calibrate_again(engine, tmp_path)


@pytest.mark.parametrize("content", ["", "[]", '{"target": {}}'])
def test_cache_file_that_is_not_a_cost_model_is_a_value_error(tmp_path, content):
    engine, path = cached(tmp_path)
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        calibrate_again(engine, tmp_path)


def test_cache_file_with_an_incomplete_grid_is_a_value_error(tmp_path):
    engine, path = cached(tmp_path)
    data = json.loads(path.read_text())
    data["target"]["times"] = data["target"]["times"][:-1]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="incomplete grid"):
        calibrate_again(engine, tmp_path)


@pytest.mark.parametrize("content", ["{", '{"batch_sizes": [1, 2]}', '{"batch_sizes": [1, 2], "greedy_token": [1, 2], '
                                     '"sampled_token": [1, 2], "noise": [1]}'])
def test_sampling_cache_file_that_is_not_sampling_times_is_a_value_error(tmp_path, content):
    engine, path = cached(tmp_path)
    sampling = path.with_name(path.stem + "-sampling.json")
    sampling.write_text(content)
    with pytest.raises(ValueError, match=re.escape(f"calibration cache {sampling}")):
        calibrate_again(engine, tmp_path)
