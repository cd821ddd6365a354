"""The `specroll` command: a user's mistake is one line on stderr and exit code 2; `--debug` shows the traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specroll.cli import main
from specroll.integrations.yaml_config import ConfigError


def test_a_missing_config_file_is_one_line_and_exit_code_2(tmp_path):
    missing = tmp_path / "nonexistent.yaml"
    done = subprocess.run([sys.executable, "-m", "specroll.cli", "train", "--config", str(missing)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"specroll train: error: cannot read config {missing}: No such file or directory"]


def test_a_bad_field_is_one_line_and_exit_code_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("grpo: {learning_rate: fast}\n")
    assert main(["train", "--config", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "specroll train: error: grpo.learning_rate='fast' is invalid: a number"]


def test_an_unknown_recipe_is_one_line_and_exit_code_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("models: {recipe: huge}\n")
    assert main(["train", "--config", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "specroll train: error: models.recipe='huge' is invalid: one of ('full', 'tiny')"]


@pytest.mark.parametrize("argv", [["train"], ["train", "--config", "x.yaml", "--stepz", "3"], ["trian"]])
def test_a_bad_command_line_is_one_line_and_exit_code_2(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "error:" in err and "--help" in err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        main(["train", "--debug", "--config", str(tmp_path / "nonexistent.yaml")])
