"""`specroll distill` on a user-shaped folder (a Qwen2 model and its tokenizer saved here): it samples, trains through
the online learner, writes what `models:` reads and a report, resumes from its folder, and refuses bad input in
one line."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import build_lm
from trl_tiny import tiny_tokenizer

from specroll.cli import main
from specroll.integrations.head_file import read_head_file
from specroll.integrations.model_source import ModelPaths, load_drafter
from specroll.rollout import EngineConfig
from specroll.rollout.drafters.heads import EagleHead

FAST = ["--num-prompts", "8", "--samples", "2", "--max-new-tokens", "8", "--minutes", "0.06", "--round-minutes",
        "0.02", "--cost-model-s", "0.3", "--batch-size", "4", "--batch-rows", "8", "--threads", "1"]


@pytest.fixture
def user_folder(tmp_path):
    """A Qwen2 policy with a character tokenizer and chat template, saved as a user's `save_pretrained` folder,
    and a prompts file of conversations."""
    tokenizer = tiny_tokenizer()
    policy = build_lm("qwen2", "sdpa", vocab=len(tokenizer), hidden=32, layers=2, seed=0, logit_scale=1.0,
                      max_position_embeddings=64, eos_token_id=tokenizer.eos_token_id)
    policy.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{a * 3}="}]} for a in range(8)]
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return tmp_path


def distill(folder, out, *extra):
    return main(["distill", "--policy", str(folder / "policy"), "--prompts", str(folder / "prompts.jsonl"),
                 "--out", str(out), *FAST, *extra])


def test_eagle_head_end_to_end_is_what_models_reads(user_folder, capsys):
    out = user_folder / "eagle"
    assert distill(user_folder, out, "--kind", "eagle", "--eagle-intermediate-size", "32") == 0
    rounds = json.loads((out / "rounds.json").read_text())
    phases = [r["phase"] for r in rounds]
    assert phases in ([0, 0, 1], [0, 1])  # 2 of 1e-3 (the second only if the first left it time), 1 of 2e-4
    for phase, budget_s in ((0, 0.06 * 60 * 2 / 3), (1, 0.06 * 60 / 3)):  # a round starts only within the budget
        times = [r["round_time_s"] for r in rounds if r["phase"] == phase]
        assert sum(times[:-1]) < budget_s
    assert all(r["gated"] for r in rounds) and 0 < rounds[-1]["served"] <= 1
    report = (out / "report.md").read_text()
    assert "| 64 |" in report and "predicted speed-up" in report and f"{rounds[-1]['served']:.4f}" in report
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(user_folder / "policy")
    head = load_drafter(ModelPaths(str(user_folder / "policy"), head=str(out / "eagle.pt")),
                        EngineConfig(drafters=("eagle",)), target)
    assert isinstance(head, EagleHead)
    saved = read_head_file(out / "eagle.pt").weights
    assert all(torch.equal(t, saved[name]) for name, t in head.state_dict().items())
    assert "held-out expected acceptance" in capsys.readouterr().out


@pytest.mark.parametrize("kind, extra", [("eagle3", ()), ("block", ("--block-size", "4"))])
def test_fused_feature_heads_train_on_their_layers_and_load_as_models_reads(user_folder, kind, extra):
    """EAGLE-3's and the block drafter's samples carry the states of their target layers (k·H wide), captured by
    the sampling engine; the head written is the one `models.head` loads over a fresh head of the engine's
    defaults (the block size from the config the report prints), and it drafts exactly (greedy = plain)."""
    from transformers import AutoModelForCausalLM

    from specroll.rollout import SamplingParams, SpecEngine

    out = user_folder / kind
    assert distill(user_folder, out, "--kind", kind, *extra) == 0
    target = AutoModelForCausalLM.from_pretrained(user_folder / "policy")
    chunk = torch.load(next((out / "samples").iterdir()), weights_only=True)
    fresh = load_drafter(ModelPaths(str(user_folder / "policy")), EngineConfig(drafters=(kind,), block_size=4, gamma=3),
                         target)
    width = target.config.hidden_size * len(fresh.target_layers)
    assert fresh.target_layers == {"eagle3": (0, 1), "block": (0,)}[kind]  # a 2-layer policy's defaults
    assert all(row["hidden"].shape[1] == width for row in chunk)
    rounds = json.loads((out / "rounds.json").read_text())
    assert all(r["gated"] for r in rounds) and 0 < rounds[-1]["served"] <= 1
    report = (out / "report.md").read_text()
    assert f"drafters: [{kind}]" in report and ("block_size: 4" in report) == (kind == "block")
    config = EngineConfig(drafters=(kind,), block_size=4, gamma=3, max_batch_size=4, max_seq_len=48)
    head = load_drafter(ModelPaths(str(user_folder / "policy"), head=str(out / f"{kind}.pt")), config, target)
    saved = read_head_file(out / f"{kind}.pt").weights
    assert all(torch.equal(t, saved[name]) for name, t in head.state_dict().items())
    prompts = [[1, 5, 9, 3], [2, 7]]
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    plain = SpecEngine(target, None, EngineConfig(gamma=0, max_batch_size=4, max_seq_len=48)).generate(prompts, params)
    spec = SpecEngine(target, head, config).generate(prompts, params)
    assert [r.completion_ids for r in spec] == [r.completion_ids for r in plain]


def test_recurrent_head_is_what_models_reads_and_drafts_beams_exactly(user_folder):
    """`--kind recurrent` writes `recurrent.pt`, which `models.head` loads over a fresh
    head of the engine's defaults; it drafts chains and beam trees exactly (greedy = plain)."""
    from transformers import AutoModelForCausalLM

    from specroll.rollout import SamplingParams, SpecEngine
    from specroll.rollout.drafters.heads import RecurrentHead

    out = user_folder / "recurrent"
    assert distill(user_folder, out, "--kind", "recurrent") == 0
    rounds = json.loads((out / "rounds.json").read_text())
    assert all(r["gated"] for r in rounds) and 0 < rounds[-1]["served"] <= 1
    assert "drafters: [recurrent]" in (out / "report.md").read_text()
    target = AutoModelForCausalLM.from_pretrained(user_folder / "policy")
    prompts = [[1, 5, 9, 3], [2, 7]]
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    plain = SpecEngine(target, None, EngineConfig(gamma=0, max_batch_size=4, max_seq_len=48)).generate(prompts, params)
    for width in (1, 3):
        config = EngineConfig(drafters=("recurrent",), gamma=3, tree_width=width, max_batch_size=4, max_seq_len=48)
        head = load_drafter(ModelPaths(str(user_folder / "policy"), head=str(out / "recurrent.pt")), config, target)
        assert isinstance(head, RecurrentHead)
        saved = read_head_file(out / "recurrent.pt").weights
        assert all(torch.equal(t, saved[name]) for name, t in head.state_dict().items())
        spec = SpecEngine(target, head, config).generate(prompts, params)
        assert [r.completion_ids for r in spec] == [r.completion_ids for r in plain]


def test_a_head_trained_over_a_draft_vocabulary_carries_it_to_the_engine_and_the_learner(user_folder, capsys):
    """`--draft-vocab N`: the learner trains and scores over the N ids the samples' completions use most (the stop
    id in); the head file carries them (`integrations.head_file`), `models.head` loads them, and an engine with
    `draft_vocab: N` — and the online learner beside it — start from them, not from the first N ids; the output
    stays the target's. Another N is refused naming both."""
    from transformers import AutoModelForCausalLM

    from specroll.integrations.local_backend import LocalBackend
    from specroll.online_drafter import LearnerConfig
    from specroll.rollout import SamplingParams, SpecEngine
    from specroll.rollout.drafters.draft_vocab import first_ids, top_ids

    out = user_folder / "dv"
    assert distill(user_folder, out, "--kind", "eagle3", "--draft-vocab", "8") == 0
    ids = read_head_file(out / "eagle3.pt").draft_vocab
    target = AutoModelForCausalLM.from_pretrained(user_folder / "policy")
    counts = torch.zeros(target.config.vocab_size, dtype=torch.long)
    for chunk in (out / "samples").iterdir():
        for row in torch.load(chunk, weights_only=True):
            completion = row["token_ids"][row["prompt_len"] :]
            counts.index_add_(0, completion, torch.ones_like(completion))
    eos = target.config.eos_token_id
    assert torch.equal(ids, top_ids(counts, 8, [eos])) and int(counts.argmax()) in ids.tolist()
    assert not torch.equal(ids, first_ids(8, target.config.vocab_size, [eos]))  # counted, not the first ids
    assert "draft_vocab: 8" in (out / "report.md").read_text()
    rounds = json.loads((out / "rounds.json").read_text())
    assert all(r["gated"] for r in rounds) and 0 < rounds[-1]["served"] <= 1

    config = EngineConfig(drafters=("eagle3",), gamma=3, max_batch_size=4, max_seq_len=48, draft_vocab=8)
    paths = ModelPaths(str(user_folder / "policy"), head=str(out / "eagle3.pt"))
    engine = SpecEngine(target, load_drafter(paths, config, target), config)
    assert torch.equal(engine.draft_vocab(), ids)
    prompts, params = [[1, 5, 9, 3], [2, 7]], SamplingParams(max_new_tokens=10, temperature=0.0)
    plain = SpecEngine(target, None, EngineConfig(gamma=0, max_batch_size=4, max_seq_len=48)).generate(prompts, params)
    assert [r.completion_ids for r in engine.generate(prompts, params)] == [r.completion_ids for r in plain]
    backend = LocalBackend.from_models(target, load_drafter(paths, config, target), config,
                                       LearnerConfig(batch_size=4, max_steps=1))
    assert torch.equal(backend.learner.draft_vocab("frozen"), ids) and torch.equal(backend.engine.draft_vocab(), ids)
    with pytest.raises(ValueError, match="draft_vocab=6 is invalid with this drafter: it was trained over a draft "
                                         "vocabulary of 8 ids"):
        SpecEngine(target, load_drafter(paths, config, target), EngineConfig(drafters=("eagle3",), draft_vocab=6,
                                                                            max_batch_size=4, max_seq_len=48))
    capsys.readouterr()
    assert distill(user_folder, user_folder / "x", "--kind", "model", "--layers", "1", "--draft-vocab", "8") == 2
    assert "--draft-vocab=8 is invalid with --kind=model" in one_line_error(capsys)
    assert distill(user_folder, user_folder / "y", "--kind", "eagle", "--draft-vocab", "100000") == 2
    assert "--draft-vocab=100000 is invalid: an int in [1, " in one_line_error(capsys)


def test_a_stopped_run_resumes_from_its_folder(user_folder, capsys):
    out = user_folder / "resume"
    assert distill(user_folder, out, "--kind", "medusa", "--final-lr", "1e-3") == 0  # one phase
    chunks = {p: p.stat().st_mtime_ns for p in (out / "samples").iterdir()}
    first = json.loads((out / "rounds.json").read_text())
    capsys.readouterr()
    assert distill(user_folder, out, "--kind", "medusa", "--final-lr", "1e-3", "--minutes", "0.12") == 0
    assert "resuming the run" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (out / "samples").iterdir()} == chunks  # nothing sampled again
    rounds = json.loads((out / "rounds.json").read_text())
    assert 1 <= len(first) <= 3 and len(first) < len(rounds) <= 6
    assert [r["num_steps"] for r in rounds[: len(first)]] == [r["num_steps"] for r in first]  # kept as they were
    assert main(["distill", "--policy", str(user_folder / "policy"), "--prompts", str(user_folder / "prompts.jsonl"),
                 "--out", str(out), *FAST, "--kind", "medusa", "--seed", "5"]) == 2
    assert "holds a run with other final_lr, seed" in capsys.readouterr().err


def test_a_killed_run_resumes_where_it_stopped(user_folder):
    import subprocess
    import sys
    import time

    out = user_folder / "killed"
    argv = ["--policy", str(user_folder / "policy"), "--prompts", str(user_folder / "prompts.jsonl"), "--out", str(out),
            *FAST, "--minutes", "0.3"]  # 15 rounds of 1.2 s: killed during the first ones
    job = subprocess.Popen([sys.executable, "-m", "specroll.cli", "distill", *argv], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (out / "learner.pt").is_file() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    job.kill()
    job.wait()
    assert (out / "learner.pt").is_file() and not (out / "report.md").is_file()  # stopped mid-training
    before = torch.load(out / "learner.pt", weights_only=False)["rounds"]
    assert main(["distill", *argv]) == 0
    rounds = json.loads((out / "rounds.json").read_text())
    phases = [r["phase"] for r in rounds]
    assert len(before) < len(rounds) <= 15 and phases == sorted(phases) and set(phases) == {0, 1}
    assert [r["num_steps"] for r in rounds[: len(before)]] == [r["num_steps"] for r in before]
    argv[-1] = "0.5"  # more minutes once the last phase ran: that phase goes on, the first is not taken up again
    assert main(["distill", *argv]) == 0
    more = [r["phase"] for r in json.loads((out / "rounds.json").read_text())]
    assert more[: len(phases)] == phases and set(more[len(phases):]) == {1}


def test_model_kind_cut_from_the_policys_first_layers(user_folder):
    out = user_folder / "lm"
    assert distill(user_folder, out, "--kind", "model", "--layers", "1") == 0
    from transformers import AutoModelForCausalLM

    drafter = AutoModelForCausalLM.from_pretrained(out / "drafter")
    assert drafter.config.num_hidden_layers == 1 and drafter.config.model_type == "qwen2"
    assert (out / "drafter" / "tokenizer_config.json").is_file()


def one_line_error(capsys) -> str:
    """The job's error: one line on stderr (beside the loaders' progress bars), no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "specroll distill: error:" in line]
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


def test_no_tokenizer_is_one_line(user_folder, capsys):
    bare = user_folder / "bare"
    build_lm("qwen2", "sdpa", vocab=48, seed=0).save_pretrained(bare)
    assert main(["distill", "--policy", str(bare), "--prompts", str(user_folder / "prompts.jsonl"),
                 "--out", str(user_folder / "x"), *FAST]) == 2
    assert "no tokenizer found there" in one_line_error(capsys)


def test_a_prompt_longer_than_the_context_is_one_line(user_folder, capsys):
    assert distill(user_folder, user_folder / "x", "--max-seq-len", "12") == 2
    assert "prompt 0 has" in one_line_error(capsys)


def test_a_drafter_of_another_vocabulary_is_one_line(user_folder, capsys):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0, "x": 1}, "<unk>")),
                                    unk_token="<unk>")
    drafter = user_folder / "other"
    build_lm("qwen2", "sdpa", vocab=len(tiny_tokenizer()), layers=1, seed=2).save_pretrained(drafter)
    other.save_pretrained(drafter)
    assert distill(user_folder, user_folder / "x", "--kind", "model", "--drafter", str(drafter)) == 2
    assert "--drafter=" in (err := one_line_error(capsys)) and "cannot be mapped onto the target's" in err


TASK = '''
def prompts(count, seed):
    return [[{"role": "user", "content": f"{(seed + i) % 50}+{i % 7}="}] for i in range(count)]

def reward(prompts, completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]
'''
SERVE = """
models: {{source: pretrained, target: {root}/policy, head: {root}/eagle/eagle.pt}}
task: {{dataset: "distill_task:prompts", reward: "distill_task:reward"}}
grpo: {{steps: 2, prompts_per_step: 2, num_generations: 2, max_completion_length: 8, num_train_prompts: 8}}
backend: {{kind: local}}
engine: {{max_batch_size: 4, max_seq_len: 48, gamma: 2, drafters: [eagle]}}
learner: {{max_steps: 2, batch_size: 4}}
probe: {{prompts: 0}}
report: {{out_dir: {root}/report, speed_prompts: 2, speed_repeats: 1}}
torch_threads: 1
"""


def test_specroll_train_serves_the_distilled_head(user_folder, monkeypatch):
    pytest.importorskip("trl")
    import argparse
    import sys

    from specroll.jobs import train

    assert distill(user_folder, user_folder / "eagle", "--kind", "eagle", "--eagle-intermediate-size", "32") == 0
    (user_folder / "distill_task.py").write_text(TASK)
    monkeypatch.syspath_prepend(str(user_folder))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(user_folder / "report" / "tensorboard"))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    config = user_folder / "serve.yaml"
    config.write_text(SERVE.format(root=user_folder))
    try:
        assert train.run(argparse.Namespace(config=str(config), out_dir=None)) == 0
    finally:
        sys.modules.pop("distill_task", None)
    steps = [json.loads(line) for line in (user_folder / "report" / "metrics.jsonl").read_text().splitlines()]
    assert [e["rollout/gamma"] for e in steps if "rollout/gamma" in e] == [2.0, 2.0]  # the head drafted every step
    assert all(e["rollout/eagle/proposals"] > 0 for e in steps if "rollout/gamma" in e)


def test_prompts_come_from_files_or_a_dotted_function(tmp_path):
    from specroll.jobs.distill_data import load_prompts, tokenize

    (tmp_path / "p.txt").write_text("1+2=\n\n3+4=\n")
    (tmp_path / "p.json").write_text(json.dumps(["5+6=", {"prompt": "7+8="}]))
    assert load_prompts(str(tmp_path / "p.txt"), 10) == ["1+2=", "3+4="]
    assert load_prompts(str(tmp_path / "p.json"), 1) == ["5+6="]
    assert load_prompts("specroll.demo.task:make_prompts", 3) == load_prompts("specroll.demo.task.make_prompts", 3)
    ids = tokenize(["1+2=", "33+4="], tiny_tokenizer(), context=32, max_new_tokens=8)
    assert [len(row) for row in ids] == [4, 5]
    from specroll.integrations.yaml_config import ConfigError

    with pytest.raises(ConfigError, match=r"--prompts='nowhere:prompts' is invalid"):
        load_prompts("nowhere:prompts", 3)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ConfigError, match="it gave no prompts"):
        load_prompts(str(tmp_path / "empty.txt"), 3)
