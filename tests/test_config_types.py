"""Config fields are typed at load: each bad YAML value fails with `section.field`, the value and what is allowed."""

from __future__ import annotations

import pytest
import yaml

from specroll.integrations.yaml_config import ConfigError, from_dict
from specroll.jobs.train_config import load_train_config
from specroll.online_drafter import LearnerConfig
from specroll.rollout import SamplingParams


def write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def load_train(tmp_path, data: dict):
    return load_train_config(write(tmp_path, yaml.safe_dump(data)))


def test_numeric_strings_load_as_floats(tmp_path):
    # PyYAML reads `3e-4` (no dot) as a string: users write it, so a float field takes it.
    config = load_train_config(write(tmp_path, (
        "grpo: {learning_rate: 3e-4, temperature: 1}\n"
        "engine: {acceptance_ema: 8e-1}\n"
        "learner: {lr: 1e-3}\n"
        "backend: {sync: {bucket_mb: 1e2}, topology: {worker: {num_cpus: 5e-1}}}\n"
    )))
    assert config.grpo.learning_rate == 3e-4 and type(config.grpo.learning_rate) is float
    assert type(config.grpo.temperature) is float
    assert config.engine.acceptance_ema == 0.8
    assert config.learner.lr == 1e-3
    assert config.backend.sync.bucket_mb == 100.0 and config.backend.topology.worker.num_cpus == 0.5


@pytest.mark.parametrize(("data", "message"), [
    ({"grpo": {"learning_rate": "fast"}}, "grpo.learning_rate='fast' is invalid: a number"),
    ({"learner": {"lr": "slow"}}, "learner.lr='slow' is invalid: a number"),
    ({"learner": {"time_budget_s": "3s"}}, "learner.time_budget_s='3s' is invalid: a number or null"),
    ({"backend": {"topology": {"num_workers": "two"}}}, "backend.topology.num_workers='two' is invalid: an int"),
    ({"backend": {"sync": {"timeout_s": "long"}}}, "backend.sync.timeout_s='long' is invalid: a number"),
    ({"engine": {"acceptance_ema": "high"}}, "engine.acceptance_ema='high' is invalid: a number"),
    ({"grpo": {"steps": 2.5}}, "grpo.steps=2.5 is invalid: an int"),
    ({"models": {"target": 7, "source": "pretrained"}}, "models.target=7 is invalid: a string or null"),
    ({"grpo": {"extra": ["bf16"]}}, "grpo.extra=['bf16'] is invalid: a mapping"),
])
def test_a_value_of_the_wrong_type_is_named(tmp_path, data, message):
    with pytest.raises(ConfigError) as err:
        load_train(tmp_path, data)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(("data", "message"), [
    ({"engine": {"gamma": True}}, "engine.gamma=True is invalid: an int or 'auto'"),
    ({"grpo": {"steps": True}}, "grpo.steps=True is invalid: an int"),
    ({"learner": {"max_steps": False}}, "learner.max_steps=False is invalid: an int"),
    ({"online_learning": 1}, "online_learning=1 is invalid: true or false"),
    ({"grpo": {"bf16": "yes please"}}, "grpo.bf16='yes please' is invalid: true or false"),
])
def test_booleans_and_ints_do_not_stand_in_for_each_other(tmp_path, data, message):
    with pytest.raises(ConfigError) as err:
        load_train(tmp_path, data)
    assert str(err.value).startswith(message)


def test_an_emptied_section_fails_at_load_with_a_hint(tmp_path):
    path = write(tmp_path, "grpo: {steps: 2}\nreport:\n  # out_dir: somewhere\n  # speed_prompts: 4\n")
    with pytest.raises(ConfigError, match=r"report=None is invalid: a mapping of ReportSettings fields.*report: \{\}"):
        load_train_config(path)


@pytest.mark.parametrize("text", ["grpo: [1, 2]\n", "engine: auto\n"])
def test_every_section_must_be_a_mapping(tmp_path, text):
    with pytest.raises(ConfigError, match=r"is invalid: a mapping of \w+ fields"):
        load_train_config(write(tmp_path, text))


def test_learner_section_is_a_typed_learner_config(tmp_path):
    config = load_train(tmp_path, {"learner": {"max_steps": 3, "loss": "tv"}})
    assert config.learner == LearnerConfig(max_steps=3, loss="tv")
    with pytest.raises(ConfigError, match=r"learner has unknown fields \['max_stepz'\]"):
        load_train(tmp_path, {"learner": {"max_stepz": 3}})


def test_range_checks_name_their_section(tmp_path):
    with pytest.raises(ConfigError, match=r"^backend\.topology: num_workers=0 is invalid: an int >= 1"):
        load_train(tmp_path, {"backend": {"topology": {"num_workers": 0}}})
    with pytest.raises(ConfigError, match=r"^learner: lr=-1\.0 is invalid: a number > 0"):
        load_train(tmp_path, {"learner": {"lr": -1.0}})


def test_lists_and_tuples_are_typed_item_by_item(tmp_path):
    config = load_train(tmp_path, {"grpo": {"extra": {"top_k": 5}}, "backend": {"sync": {"bucket_mb": "3e1"}}})
    assert config.backend.sync.bucket_mb == 30.0 and config.grpo.extra == {"top_k": 5}
    sampling = from_dict(SamplingParams, {"max_new_tokens": 4, "stop_token_ids": [2, 3]})
    assert sampling.stop_token_ids == (2, 3)
    with pytest.raises(ConfigError, match=r"^stop_token_ids\[1\]='eos' is invalid: an int"):
        from_dict(SamplingParams, {"max_new_tokens": 4, "stop_token_ids": [2, "eos"]})


def test_a_missing_or_unparsable_file_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read config .*nope\.yaml: No such file or directory"):
        load_train_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError) as err:
        load_train_config(write(tmp_path, "grpo: {steps: 2\nengine: {}\n"))
    assert "run.yaml is not valid YAML" in str(err.value) and "\n" not in str(err.value)
