"""`studies/tree_tail.py` runs end to end on tiny models (a smoke run of the code, not a measurement), and the
report plots accepted length against live batch."""

from __future__ import annotations

import json

import pytest

from specroll.jobs.report import PLOTS, SpeedMeasurement, _plot_accepted


@pytest.fixture
def tree_tail(study):
    return study("tree_tail")


def test_tree_tail_writes_paired_ratios_for_both_workloads(tree_tail, tmp_path, capsys):
    out = tmp_path / "tree_tail.json"
    assert tree_tail.main(["--models", "tiny", "--repeats", "2", "--rows", "3", "--full-rows", "3", "--new-tokens",
                           "8", "--quick", "--calibration-s", "0.3", "--calibration-cache", str(tmp_path / "cal"),
                           "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    tree = data["tail"]["tree_3x2"]
    assert tree["vs_best_chain"] == "chain_gamma_2" and tree["tree_share"] == 1.0
    assert tree["tokens_per_call_x"]["repeats"] == 2 and tree["tokens_per_s_x"]["mean"] > 0
    assert data["full"]["auto_trees"]["vs_best_chain"] == "auto_chains"
    printed = capsys.readouterr().out
    assert "tail (live batch <= 4)" in printed and "full batch (3 rows)" in printed


def test_tree_tail_compares_a_tree_with_the_chain_of_its_depth(tree_tail, tmp_path, capsys):
    out = tmp_path / "tree_tail.json"
    assert tree_tail.main(["--models", "tiny", "--repeats", "2", "--rows", "3", "--new-tokens", "8", "--chain-gammas",
                           "2,3", "--tree-shapes", "3x2", "--skip-full", "--calibration-s", "0.3",
                           "--calibration-cache", str(tmp_path / "cal"), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    tree, same = data["tail"]["tree_3x2"], data["tail"]["chain_gamma_3"]
    assert data["full"] is None and tree["same_depth_chain"] == "chain_gamma_3"
    assert "same_depth_chain" not in data["tail"]["auto_trees"] and tree["ms_per_call"] > 0
    assert tree["tokens_per_call_vs_same_depth_x"]["mean"] > 0 and tree["flat_x"]["repeats"] == 2
    # the projection prices the tree's calls at its same-depth chain's: with the mean seconds per call of each
    best = data["tail"][tree["vs_best_chain"]]
    rough = tree["tokens_per_call"] / same["ms_per_call"] / (best["tokens_per_s"] / 1e3)
    assert abs(tree["flat_x"]["mean"] - rough) < 0.5 * rough
    assert "full batch" not in capsys.readouterr().out


def test_tree_tail_runs_the_full_workload_alone_and_refuses_running_nothing(tree_tail, tmp_path):
    out = tmp_path / "tree_tail.json"
    common = ["--models", "tiny", "--repeats", "1", "--full-rows", "3", "--new-tokens", "6", "--calibration-s", "0.3",
              "--calibration-cache", str(tmp_path / "cal")]
    assert tree_tail.main([*common, "--skip-tail", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["tail"] is None and set(data["full"]) == {"auto_chains", "auto_trees"}
    with pytest.raises(ValueError, match="leave nothing to run"):
        tree_tail.main([*common, "--skip-tail", "--skip-full"])


def test_lognormal_budgets_drain_the_batch(tree_tail):
    budgets = tree_tail.budgets(16, 100, 400)
    assert len(budgets) == 16 and max(budgets) > 2 * min(budgets) and max(budgets) <= 400


def test_report_plots_accepted_length_by_live_batch(tmp_path):
    speed = SpeedMeasurement(100.0, 50.0, 0.5, 2.0, [3, 3, 3], [4, 4, 1], [8, 12, 3])
    path = _plot_accepted(tmp_path / "accepted_live_batch.png", speed)
    assert path.is_file() and path.stat().st_size > 0 and "accepted_live_batch" in PLOTS
