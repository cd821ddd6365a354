"""The GPU check script runs end to end on a CPU with tiny settings, and fails on a wrong engine."""

from __future__ import annotations

import dataclasses

import specroll.rollout.engine as engine_module
from specroll.benchmarks import gpu_check

TINY = ["--tiny", "--device", "cpu", "--batch-sizes", "1,4", "--max-new-tokens", "8", "--calibration-budget", "0.2"]


def test_gpu_check_passes_with_tiny_settings(tmp_path, capsys):
    assert gpu_check.main([*TINY, "--calibration-cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("greedy fp32 exactness") == out.count(": ok (") == 3
    assert "bf16 greedy" in out and "(ok," in out and "all checks passed" in out
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


def gpu_check_args(tmp_path):
    class Args:
        device, max_new_tokens, calibration_budget, calibration_cache = "cpu", 8, 0.2, str(tmp_path)

    return Args()
