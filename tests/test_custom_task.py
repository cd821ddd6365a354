"""`specroll train` on a user's own task: models from folders, the dataset and the reward by dotted path in
the run config, the in-process backend — nothing of the demo is built or imported."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

pytest.importorskip("trl")

from trl_tiny import tiny_model, tiny_tokenizer

from specroll.integrations.yaml_config import ConfigError
from specroll.jobs import train
from specroll.jobs.task_source import load_task, resolve
from specroll.jobs.train_config import TaskSettings

TASK_MODULE = '''
CALLS = []

def prompts(count, seed):
    return [f"{(seed + i) % 97}+{i % 7}=" for i in range(count)]

def reward(prompts, completions, **kwargs):
    CALLS.append(len(completions))
    return [float(len(c)) for c in completions]
'''

CONFIG = """
models: {{source: pretrained, target: {root}/target, drafter: {root}/drafter, tokenizer: {root}/tokenizer}}
task: {{dataset: "my_task:prompts", reward: "my_task:reward"}}
grpo: {{steps: 2, prompts_per_step: 2, num_generations: 2, max_completion_length: 8, num_train_prompts: 8}}
backend: {{kind: local}}
engine: {{max_batch_size: 4, max_seq_len: 64, gamma: 2}}
learner: {{max_steps: 2, batch_size: 4}}
probe: {{prompts: 2, samples: 1, every: 1}}
report: {{out_dir: {root}/report, speed_prompts: 2, speed_repeats: 1}}
torch_threads: 1
"""


@pytest.fixture
def user_task(tmp_path, monkeypatch):
    (tmp_path / "my_task.py").write_text(TASK_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    tiny_model(len(tokenizer), seed=0).save_pretrained(tmp_path / "target")
    tiny_model(len(tokenizer), seed=1, hidden=16, layers=1).save_pretrained(tmp_path / "drafter")
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG.format(root=tmp_path))
    yield config
    sys.modules.pop("my_task", None)


def test_train_runs_a_custom_dataset_and_reward_by_dotted_path(user_task, tmp_path, capsys, monkeypatch):
    # The job sets these for its process with setdefault; this one is the test session's: restore them after.
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "report" / "tensorboard"))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    assert train.run(argparse.Namespace(config=str(user_task), out_dir=None)) == 0
    assert sys.modules["my_task"].CALLS == [4, 4]  # 2 prompts × G = 2, at each of the 2 steps
    assert "building the demo models" not in capsys.readouterr().out
    steps = [json.loads(line) for line in (tmp_path / "report" / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in steps if "reward" in e] == [1, 2]


def test_task_paths_are_checked_at_load(tmp_path):
    with pytest.raises(ValueError, match=r"task\.reward"):
        TaskSettings(dataset="my_task:prompts")
    with pytest.raises(ConfigError, match=r"task.dataset='nowhere:prompts' is invalid: no importable object"):
        load_task(TaskSettings(dataset="nowhere:prompts", reward="nowhere:reward"), max_digits=3)
    assert resolve("json.dumps", "x") is json.dumps and resolve("json:loads", "x") is json.loads
