"""The GPU check script runs end to end on a CPU with tiny settings, and fails on a wrong engine or on rotary
frequencies cast to bf16; what it imports runs on the lent GPU machine (torch, transformers, the standard
library); a stage that would start past the time budget is skipped. Syncs are only counted on a GPU: here,
how they are told apart from other warnings."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

import specroll.rollout.models.weights as weights_module
import specroll.rollout.step.base as engine_module
from specroll.bench import gpu_check

TINY = ["--tiny", "--device", "cpu", "--batch-sizes", "1,4", "--max-new-tokens", "8", "--calibration-budget", "0.2",
        "--cell-rows", "4"]


def test_gpu_check_passes_with_tiny_settings(tmp_path, capsys):
    assert gpu_check.main([*TINY, "--calibration-cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    exact = [line for line in out.splitlines() if line.startswith("greedy fp32 exactness")]
    assert len(exact) == 7 and all(": ok (" in line for line in exact)  # model, suffix, both; 4 heads
    assert "bf16 greedy" in out and "(ok," in out and "all checks passed" in out
    assert "fp32 rotary after the bf16 cast: ok" in out
    cell = [line for line in out.splitlines() if line.startswith("| ") and line.endswith("| n/a (cpu) |")]
    assert [line.split(" | ")[0] for line in cell] == [f"| {kind}" for kind in gpu_check.SYNC_KINDS]
    table = [line for line in out.splitlines() if line.startswith(("| 1 |", "| 4 |"))]
    assert len(table) == 2 and all(line.count("×") == 4 for line in table)


def test_gpu_check_fails_when_speculative_tokens_are_wrong(tmp_path, monkeypatch, capsys):
    append = engine_module.append_kept

    def shifted(rows, live, step, *args, **kwargs):  # a kept-token bug: each step's tokens rotated
        wrong = dataclasses.replace(step.verdict, tokens=step.verdict.tokens.roll(1, dims=1))
        return append(rows, live, dataclasses.replace(step, verdict=wrong), *args, **kwargs)

    monkeypatch.setattr(engine_module, "append_kept", shifted)
    assert gpu_check.check_exact(gpu_check.build("tiny_target", 0), gpu_check.build("tiny_drafter", 1),
                                 gpu_check_args(tmp_path)) is False
    assert "MISMATCH" in capsys.readouterr().out


def test_gpu_check_fails_when_the_bf16_cast_takes_rotary_frequencies_along(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(weights_module, "FP32_BUFFER_SUFFIXES", ())  # the cast keeps no buffer in fp32
    assert gpu_check.check_bf16(gpu_check.build("tiny_target", 0), gpu_check.build("tiny_drafter", 1),
                                gpu_check_args(tmp_path)) is False
    assert "fp32 rotary after the bf16 cast: FAIL" in capsys.readouterr().out


def test_sync_count_counts_only_the_sync_debug_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for message in (gpu_check.SYNC_WARNING, "something else", gpu_check.SYNC_WARNING):
            warnings.warn(message, UserWarning, stacklevel=1)
    assert gpu_check.count_sync_warnings(caught) == 2


def test_a_stage_past_the_budget_is_skipped_and_says_so(capsys):
    spent = argparse.Namespace(started=time.perf_counter() - 430.0, budget_s=480.0)  # 50 s left: under the reserve
    assert gpu_check.within_budget(argparse.Namespace(started=time.perf_counter(), budget_s=480.0), "grid row b = 1")
    assert not gpu_check.within_budget(spent, "sync cell")
    assert "sync cell: skipped (430s of the 480s budget spent)" in capsys.readouterr().out


def test_gpu_check_imports_only_torch_transformers_and_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"torch", "transformers", "specroll"}
    imported = {}
    for name in loaded_by_gpu_check():
        path = getattr(importlib.import_module(name), "__file__", None)
        for node in ast.walk(ast.parse(Path(path).read_text())) if path else ():
            if isinstance(node, ast.Import):
                imported.update({alias.name.split(".")[0]: name for alias in node.names})
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported[node.module.split(".")[0]] = name
    assert {top: by for top, by in imported.items() if top not in allowed} == {}


def loaded_by_gpu_check() -> list[str]:
    """The specroll modules that importing gpu_check loads, in a fresh interpreter."""
    code = "import sys, specroll.bench.gpu_check; print(*(n for n in sys.modules if n.startswith('specroll')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.split()


def gpu_check_args(tmp_path):
    class Args:
        device, max_new_tokens, calibration_budget, calibration_cache = "cpu", 8, 0.2, str(tmp_path)
        bf16_tol = 0.05

    return Args()


def test_install_script_makes_gpu_check_importable_from_the_repository_root(tmp_path):
    """Run from the repository root as its doc says (where `python -m` put the source tree's own `specroll/`
    folder, which lacks the subpackages, first on sys.path): the printed exports import gpu_check from its view."""
    root = Path(gpu_check.__file__).resolve().parents[2]
    script = (f'eval "$(SPECROLL_VIEW={tmp_path} PYTHON={sys.executable} bash specroll/bench/gpu_check_install.sh)" && '
              f'{sys.executable} -m specroll.bench.gpu_check --help >/dev/null && '
              f'{sys.executable} -c "import specroll.bench.gpu_check as g; print(g.__file__)"')
    done = subprocess.run(["bash", "-c", script], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "specroll" / "bench" / "gpu_check.py")


def test_sync_site_names_specroll_frames_innermost_first_and_the_call_below_them():
    def inner():
        return traceback.extract_stack()

    def outer():
        return inner()

    stack = outer()
    stack.append(traceback.FrameSummary(torch.__file__, 7, "item"))  # as if torch's own frame synced below them
    site = gpu_check.sync_site(stack, depth=2)
    assert site.startswith("__init__.py:7 item < tests/test_gpu_check.py:")
    assert " inner < tests/test_gpu_check.py:" in site and site.endswith(" outer")


def test_the_profile_and_sdpa_stages_run(tmp_path, capsys):
    """Off by default (GPU questions); on a CPU the backends are not consulted, so the ratio only checks the loop."""
    args = ["--tiny", "--device", "cpu", "--stages", "sdpa,profile", "--batch-sizes", "1,4", "--max-new-tokens", "8"]
    engine_backends = gpu_check.attention.CUDA_SDPA_BACKENDS
    assert gpu_check.main(args) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if line.startswith(("| 1 |", "| 4 |"))]) == 2
    assert "plain step profile, bf16, b = 1" in out and "aten::" in out
    assert gpu_check.attention.CUDA_SDPA_BACKENDS is engine_backends  # the engine's list put back after the A/B
