"""tools.interleave: two runs take turns on the machine, step by step, through a shared file."""

from __future__ import annotations

import threading

import pytest

from specroll.tools.interleave import Turns, run_pair


def test_two_runs_alternate_turn_by_turn(tmp_path):
    turn_file = tmp_path / "turn"
    Turns.give(turn_file, "a")
    order: list[str] = []

    def run(role: str) -> None:  # what run_one does: wait, then a step per turn, then hand over for good
        turns = Turns(turn_file, role)
        turns.wait()
        for _ in range(3):
            order.append(role)
            turns.take_turns()
        order.append(role + " done")
        turns.hand_over()

    threads = [threading.Thread(target=run, args=(role,)) for role in ("b", "a")]  # b starts first, waits
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert order == ["a", "b", "a", "b", "a", "b", "a done", "b done"]


def test_a_role_outside_the_pair_is_refused(tmp_path):
    with pytest.raises(ValueError, match="role 'c' is invalid"):
        Turns(tmp_path / "turn", "c")


def test_a_missing_config_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="is not a file"):
        run_pair(str(tmp_path / "nope.yaml"), str(tmp_path / "nope.yaml"), tmp_path / "pair")
    assert not (tmp_path / "pair").exists()


def test_a_failed_run_ends_the_pair_with_its_status(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo: [unclosed\n")
    status = run_pair(str(bad), str(bad), tmp_path / "pair")
    assert status != 0
    assert "bad.yaml" in (tmp_path / "pair" / "a.log").read_text()
