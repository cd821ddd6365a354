"""`studies/head_bench.py` on the tiny models: the EAGLE-3, block and recurrent heads (the last drafting beam trees)
from `specroll distill`-shaped files and the draft-vocabulary contenders race in lockstep with plain decoding (a smoke
run of the benchmark's code)."""

import json
import sys

import pytest
import torch

from specroll.bench.models import load_bench_models
from specroll.rollout import EngineConfig
from specroll.rollout.drafters.block import fresh_head as fresh_block
from specroll.rollout.drafters.eagle3 import fresh_head as fresh_eagle3
from specroll.rollout.drafters.recurrent import fresh_head as fresh_recurrent


def test_heads_from_distill_files_and_draft_vocab_contenders_race_with_plain(study, tmp_path, monkeypatch, capsys):
    target = load_bench_models("tiny", 4).target
    torch.save(fresh_eagle3(EngineConfig(), target.config).state_dict(), tmp_path / "eagle3.pt")
    torch.save(fresh_block(EngineConfig(), target.config).state_dict(), tmp_path / "block.pt")
    torch.save(fresh_recurrent(EngineConfig(), target.config).state_dict(), tmp_path / "recurrent.pt")
    out = tmp_path / "heads.json"
    monkeypatch.setattr(sys, "argv", [
        "head_bench", "--models", "tiny", "--heads", str(tmp_path),
        "--contenders", "plain,model+dv,eagle3,block,recurrent+tree",
        "--batch-sizes", "1", "--modes", "greedy", "--max-new-tokens", "6", "--repeats", "1", "--grpo-prompts", "1",
        "--grpo-repeats", "1", "--draft-vocab", "16", "--threads", "1", "--out", str(out)])
    study("head_bench").main()
    result = json.loads(out.read_text())
    assert set(result["draft_costs"]) == {"model+dv", "eagle3", "block", "recurrent+tree"}
    assert all(c["parameters"] > 0 and c["ms_per_draft_token_b16"] > 0 for c in result["draft_costs"].values())
    raced = result["grpo"]["contenders"]
    assert list(raced) == ["plain", "model+dv", "eagle3", "block", "recurrent+tree"]
    assert all(r["tokens"] > 0 for r in raced.values())
    assert "16 ids for the +dv contenders" in capsys.readouterr().out


@pytest.mark.parametrize("contenders, says",
                         [("eagle9", "eagle9"), ("suffix+model+dv", "+dv"), ("eagle3", "eagle3.pt"),
                          ("layer_skip+tree", "+tree")])
def test_a_contender_it_cannot_run_is_refused_by_name(study, tmp_path, monkeypatch, contenders, says):
    monkeypatch.setattr(sys, "argv", ["head_bench", "--models", "tiny", "--heads", str(tmp_path),
                                      "--contenders", contenders, "--grpo-prompts", "0"])
    with pytest.raises(SystemExit) as refused:
        study("head_bench").main()
    assert says in str(refused.value)
