"""The learner's compute dtype: "auto" takes bf16 autocast only where the device runs it faster than fp32."""

from __future__ import annotations

import pytest
import torch

from specroll.online_drafter import LearnerConfig, autocast


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(autocast, "_RESOLVED", {})


def test_named_dtypes_are_taken_as_they_are():
    assert autocast.resolve("float32", "cpu") is None
    assert autocast.resolve("bfloat16", "cpu") is torch.bfloat16


@pytest.mark.parametrize(("fp32_s", "bf16_s", "chosen"), [(1.0, 0.5, torch.bfloat16), (1.0, 0.9, None),
                                                          (0.03, 0.26, None)])
def test_auto_on_a_cpu_takes_bf16_only_when_the_race_says_it_is_clearly_faster(monkeypatch, fp32_s, bf16_s, chosen):
    calls = []
    monkeypatch.setattr(autocast, "race_cpu", lambda: calls.append(1) or (fp32_s, bf16_s))
    assert autocast.resolve("auto", torch.device("cpu")) is chosen
    assert autocast.resolve("auto", "cpu") is chosen and calls == [1]  # raced once per process and device


def test_the_race_times_both_dtypes():
    fp32_s, bf16_s = autocast.race_cpu(rows=16, width=32, repeats=1)
    assert fp32_s > 0 and bf16_s > 0


def test_auto_is_a_valid_setting_and_others_are_refused_naming_it():
    assert LearnerConfig(compute_dtype="auto").compute_dtype == "auto"
    with pytest.raises(ValueError, match=r"compute_dtype='float16' is invalid: one of .*'auto'"):
        LearnerConfig(compute_dtype="float16")


def test_the_context_autocasts_only_to_a_resolved_dtype():
    with autocast.context("float32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast.context("bfloat16", "cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") is torch.bfloat16
