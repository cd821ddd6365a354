"""`specroll bench --workload real-shape` on a shrunk shape: every drafter in the table, ceilings that follow from
the measured costs, the auto-γ check run; and the fixed-acceptance drafter the check relies on."""

from __future__ import annotations

import json

import pytest

from specroll.bench.fixed_acceptance import FixedAcceptanceDrafter
from specroll.bench.real_shape_check import conditional_acceptance, reference_completions
from specroll.bench.real_shape_costs import random_prompts
from specroll.bench.shapes import SHAPES, build
from specroll.cli import main
from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.drafters.model import ModelDrafter
from specroll.rollout.gamma.cost_model import CostModel
from specroll.rollout.models.timing import ForwardTimes

SHRUNK = ["--vocab-size", "2048", "--target-layers", "2", "--batch-sizes", "1,4", "--query-lens", "1,2,3",
          "--draft-vocab", "512", "--acceptances", "0.6,0.8", "--auto-tokens", "6", "--threads", "1"]
DRAFTERS = ["lm_2x384", "lm_4x256", "eagle", "eagle3", "block", "medusa", "recurrent", "layer_skip1"]


def test_real_shape_workload_tables_every_drafter_with_ceilings_from_its_costs(tmp_path, capsys):
    out = tmp_path / "real_shape.json"
    assert main(["bench", "--workload", "real-shape", *SHRUNK, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    names = [d["name"] for d in report["drafters"]]
    assert names == [n for d in DRAFTERS for n in (d, f"{d}+dv512")] + ["suffix"]
    printed = capsys.readouterr().out
    assert all(f"| {name} |" in printed for name in names)
    assert "load average" in report["header"] and "torch threads 1" in report["header"]

    # The ceiling of every (drafter, batch, α), recomputed from the calibrated grids the JSON holds.
    target = ForwardTimes(**report["calibration"]["target"])
    max_gamma = report["settings"]["max_gamma"]
    for drafter in report["drafters"]:
        cost = CostModel(target=target, drafter=ForwardTimes(**drafter["times"]))
        for cell in drafter["per_batch"]:
            b = cell["batch"]
            plain = target(b, 1)
            for alpha, reported in cell["ceilings"].items():
                a = float(alpha)
                speedups = [(1 - a ** (g + 1)) / (1 - a) * plain / (target(b, g + 1) + cost.draft_time(b, g))
                            for g in range(1, max_gamma + 1)]
                assert reported["speedup"] == pytest.approx(max(speedups), rel=1e-9), (drafter["name"], b, alpha)
                assert reported["gamma"] == 1 + speedups.index(max(speedups))
    forward = {(r["batch"], r["query_len"]): r for r in report["forward"]}
    assert forward[4, 3]["seconds"] == pytest.approx(target(4, 3)) and forward[4, 1]["plain_steps"] == 1.0

    check = report["auto_check"]
    assert [r["batch"] for r in check["rows"]] == [1, 4]
    for row in check["rows"]:
        assert row["gammas"] and all(0 <= g <= max_gamma for g in row["gammas"])
        assert row["verdict"] in ("plain", "speculates") and isinstance(row["agrees"], bool)
    assert "Auto-γ check" in printed


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_fixed_acceptance_drafter_keeps_drafts_at_its_stated_rate_and_stays_lossless(alpha):
    # α = 0 and 1 make the acceptance exact (no sampling noise): none or every draft kept.
    target = build(SHAPES["tiny_target"], seed=0)
    lm = build(SHAPES["tiny_drafter"], seed=1)
    vocab = SHAPES["tiny_target"].vocab
    prompts = random_prompts(3, 8, vocab, seed=0)
    references = reference_completions(target, prompts, 12, max_seq_len=32)
    config = EngineConfig(max_batch_size=3, max_seq_len=32, gamma=3)
    inner = ModelDrafter(lm, 3, config.cache_len, config.dtype, lm.device, vocab)
    engine = SpecEngine(target, FixedAcceptanceDrafter(inner, references, alpha, vocab), config)
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    assert [r.completion_ids for r in rollouts] == [references[tuple(p)] for p in prompts]
    assert engine.stats.drafted > 0 and engine.stats.acceptance_rate == alpha
    seen = conditional_acceptance(([], []), (engine.stats.drafted_per_position, engine.stats.accepted_per_position))
    assert seen == alpha


def test_conditional_acceptance_counts_each_draft_among_those_that_reached_it():
    # Draft 0: 8 of 10 kept; draft 1 was proposed by all 10 rows but reached only in the 8: 6 kept.
    assert conditional_acceptance(([2, 2], [1, 1]), ([12, 12], [9, 7])) == pytest.approx((8 + 6) / (10 + 8))
    assert conditional_acceptance(([], []), ([], [])) is None


def test_a_bad_flag_is_one_line_and_exit_code_2(capsys):
    assert main(["bench", "--workload", "real-shape", "--query-lens", "1"]) == 2
    assert "--query-lens='1' is invalid" in capsys.readouterr().err
