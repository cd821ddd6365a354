"""`python -m specroll.tools.signal_cost` (the learner's signals' cost by source) runs end to end on tiny random models
— a smoke run of the tool, not a measurement: the capture sees every rollout, every contender is timed."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from specroll.tools.signal_cost import CONTENDERS, main


def test_the_signal_cost_tool_times_every_source_on_tiny_models(capsys):
    result = main(["--models", "tiny", "--prompts", "2", "--generations", "2", "--max-new-tokens", "6",
                   "--repeats", "1", "--eagle3"])
    assert set(CONTENDERS) <= set(result) and all(result[name] > 0 for name in CONTENDERS)
    assert "learner.signals: forward" in capsys.readouterr().out
