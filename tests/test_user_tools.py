"""specroll speaks its users' tools' language: command-line overrides, trackers, logging, extras, TRL's own flags.

Each mistake is one line (a `ConfigError`, or the CLI's stderr line and exit code 2). A missing extra is simulated
in a subprocess with `sys.modules[name] = None` (what Python does for a module that cannot be imported); the W&B
run is offline (`WANDB_MODE=offline`) in a `specroll train` of the tiny demo (slow: a minute).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from specroll.cli import main
from specroll.integrations.yaml_config import ConfigError
from specroll.jobs.train_config import load_train_config

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "demo_tiny.yaml"


def test_command_line_overrides_set_fields_over_the_yaml():
    config = load_train_config(TINY, ["grpo.steps=4", "engine.gamma=3", "engine.drafters=[model, suffix]",
                                      "learner.lr=3e-4", "report.report_to=none"])
    assert (config.grpo.steps, config.engine.gamma, config.engine.drafters) == (4, 3, ("model", "suffix"))
    assert config.learner.lr == 3e-4 and config.report.report_to == ["none"]


@pytest.mark.parametrize(("override", "message"), [
    ("grpo.stepz=4", "grpo has unknown fields ['stepz']; allowed: "),
    ("grpo.steps=many", "grpo.steps='many' is invalid: an int"),
    ("grpo.steps=0", "grpo.steps=0 is invalid: an int >= 1"),
    ("grpo.steps", "override 'grpo.steps' is invalid: section.field=value (e.g. grpo.steps=4)"),
    ("grpo.steps.x=1", "override 'grpo.steps.x=1' is invalid: grpo.steps is 2, not a section"),
])
def test_a_bad_override_is_one_line_and_exit_code_2(override, message, capsys):
    assert main(["train", "--config", str(TINY), override]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"specroll train: error: {message}"), line


@pytest.mark.parametrize(("extra", "instead"), [
    ({"learning_rate": 0.1}, "set grpo.learning_rate instead of learning_rate"),
    ({"seed": 3, "max_steps": 9}, "set grpo.steps instead of max_steps; grpo.seed instead of seed"),
    ({"report_to": "wandb"}, "set report.report_to instead of report_to"),
    ({"bf16": True}, "set grpo.bf16 instead of bf16"),
])
def test_a_grpo_extra_key_specroll_sets_is_refused_naming_the_field_to_use(tmp_path, extra, instead):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"grpo": {"extra": extra}}))
    with pytest.raises(ConfigError) as err:
        load_train_config(path)
    assert len(str(err.value).splitlines()) == 1
    assert str(err.value).startswith(f"grpo.extra={sorted(extra)!r} is invalid: fields specroll sets from its own "
                                     "config: ") and str(err.value).endswith(instead)


@pytest.mark.parametrize(("value", "message"), [
    ("comet", "report.report_to=['comet'] is invalid: some of ('tensorboard', 'wandb', 'trackio', 'none')"),
    ("[none, wandb]", "report.report_to=['none', 'wandb'] is invalid: some of"),
])
def test_report_to_names_trackers_trl_knows(value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_train_config(TINY, [f"report.report_to={value}"])


def test_report_to_is_passed_to_trl_as_named():
    from specroll.jobs.train import _report_to

    assert _report_to(SimpleNamespace(report_to=["wandb", "tensorboard"])) == ["wandb", "tensorboard"]
    assert _report_to(SimpleNamespace(report_to=["none"])) == []


def run_cli(args: list[str], blocked: tuple[str, ...] = (), env: dict[str, str] | None = None):
    """`specroll <args>` in a subprocess where the `blocked` modules cannot be imported."""
    shim = "".join(f"sys.modules[{name!r}] = None; " for name in blocked)
    code = f"import sys; {shim}from specroll.cli import main; sys.exit(main({args!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=REPO)


def test_train_without_trl_and_ray_says_which_extras_to_install_in_one_line():
    done = run_cli(["train", "--config", str(TINY)], blocked=("trl", "ray"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines() == ['specroll train: error: specroll train needs trl, ray, not installed here: '
                                        'pip install "specroll[trl,ray]"']


def test_train_on_the_local_backend_does_not_ask_for_ray():
    from specroll.jobs.train import check_extras

    check_extras({"backend": {"kind": "ray"}}, ["backend.kind=local"])  # installed here: nothing to say
    done = run_cli(["train", "--config", str(TINY), "backend.kind=local"], blocked=("ray", "matplotlib"))
    assert done.stderr.splitlines() == ['specroll train: error: specroll train needs matplotlib, not installed '
                                        'here: pip install "specroll[report]"']


def test_the_paged_kernel_without_ninja_warns_with_the_extra_to_install():
    code = ("import sys, warnings; sys.modules['ninja'] = None\n"
            "from specroll.rollout.models import paged_attention\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    assert paged_attention.kernel() is None\n"
            "print(seen[0].message)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'needs ninja, not installed here: pip install "specroll[kernel]"' in done.stdout


def test_library_messages_go_through_logging_and_quiet_silences_them(caplog, capsys):
    from specroll.log import set_verbosity

    logger = logging.getLogger("specroll.jobs.train")
    logger.info("specroll train: a message")
    assert capsys.readouterr().out == "specroll train: a message\n"
    set_verbosity(logging.WARNING)
    try:
        logger.info("specroll train: hidden")
        logger.warning("specroll: WARNING: shown")
        printed = capsys.readouterr()
        assert printed.out == "" and printed.err == "specroll: WARNING: shown\n"
    finally:
        set_verbosity(logging.INFO)


def test_quiet_and_verbose_are_options_of_every_command():
    done = run_cli(["train", "--quiet", "--verbose", "--config", str(TINY)])
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


def test_the_trl_hook_refuses_a_trainer_that_starts_its_own_vllm():
    pytest.importorskip("trl")
    from specroll.integrations.trl_hook.rollout_func import refuse_trl_vllm

    refuse_trl_vllm(SimpleNamespace(args=SimpleNamespace(use_vllm=False)))
    with pytest.raises(ValueError, match=r"use_vllm=True\) is invalid with specroll's rollout_func") as err:
        refuse_trl_vllm(SimpleNamespace(args=SimpleNamespace(use_vllm=True)))
    assert "engine.kind: vllm" in str(err.value) and len(str(err.value).splitlines()) == 1


@pytest.mark.slow
def test_report_to_wandb_offline_writes_a_wandb_run(tmp_path, tiny_demo_cache):
    pytest.importorskip("wandb")
    pytest.importorskip("trl")
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "specroll.cli", "train", "--config", str(TINY), "--out-dir",
                           str(out), "report.report_to=wandb", "backend.kind=local", "checkpoint.final=false"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "WANDB_MODE": "offline", "SPECROLL_CACHE": str(tiny_demo_cache)})
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (out / "wandb").glob("offline-run-*")
    assert list(run.glob("*.wandb")), sorted(p.name for p in run.iterdir())


@pytest.mark.slow
def test_export_writes_a_checkpoint_s_policy_and_drafter(tmp_path, tiny_demo_cache):
    """`specroll export RUN` on a run that kept checkpoints: the newest one's policy loads with `from_pretrained`,
    its drafter (demo_tiny's drafter LM) as a Hugging Face folder, the learner's published weights in it."""
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    env = {**os.environ, "SPECROLL_CACHE": str(tiny_demo_cache)}
    train = subprocess.run([sys.executable, "-m", "specroll.cli", "train", "--config", str(TINY), "--out-dir",
                            str(out), "backend.kind=local", "checkpoint.every=1", "checkpoint.final=false"],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert train.returncode == 0, train.stderr[-3000:]
    assert not (out / "policy").exists()
    done = subprocess.run([sys.executable, "-m", "specroll.cli", "export", str(out), "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 2's policy" in done.stdout and "model drafter in huggingface" in done.stdout
    AutoModelForCausalLM.from_pretrained(tmp_path / "x" / "policy")
    AutoModelForCausalLM.from_pretrained(tmp_path / "x" / "drafter")
