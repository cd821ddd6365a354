"""The `specroll` command: a user's mistake is one line on stderr and exit code 2; `--debug` shows the traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
        "specroll train: error: models.recipe='huge' is invalid: one of "
        "('full', 'tiny', 'bpe', 'bpe_tiny', 'tiny_heads32')"]


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


HEAVY = ("torch", "transformers", "ray", "trl")
PROBE = """
import runpy, sys
try:
    {call}
except SystemExit as done:
    assert done.code == 0, done.code
print("HEAVY", sorted(m for m in {heavy!r} if m in sys.modules))
"""


def heavy_imports_of(call: str, cwd) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(call=call, heavy=HEAVY)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
    return [line for line in done.stdout.splitlines() if line.startswith("HEAVY")]


@pytest.mark.parametrize("command", ["train", "bench", "build-demo-models", "distill"])
def test_help_answers_before_anything_heavy_is_imported(command, tmp_path):
    assert heavy_imports_of(f"from specroll.cli import main; main([{command!r}, '--help'])", tmp_path) == ["HEAVY []"]


def test_the_trl_example_parses_help_and_exits_writing_nothing(tmp_path):
    script = Path(__file__).resolve().parents[1] / "examples" / "trl_grpo.py"
    call = f"sys.argv = [{str(script)!r}, '--help']; runpy.run_path({str(script)!r}, run_name='__main__')"
    assert heavy_imports_of(call, tmp_path) == ["HEAVY []"]
    assert list(tmp_path.iterdir()) == []
