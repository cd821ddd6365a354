"""`specroll train` end to end on the tiny demo recipe (Ray embedded, 2 GRPO steps, ~1 min), and what it
listens on."""

from __future__ import annotations

import json

import pytest
from listening import is_loopback
from train_runs import REPO, TrainRun, run_train

from specroll.jobs.report import PLOTS


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_demo_cache) -> TrainRun:
    """`specroll train` as a user runs it, from a shell that exports `OMP_NUM_THREADS` (as HPC modules,
    container images and job launchers do) above every process's share of the 2 cores."""
    pytest.importorskip("trl")
    pytest.importorskip("ray")
    return run_train(REPO / "configs" / "demo_tiny.yaml", tmp_path_factory.mktemp("report"), tiny_demo_cache,
                     tmp_path_factory.mktemp("logs"), env={"OMP_NUM_THREADS": "4"})


def test_main_job_listens_on_loopback_only(tiny_run):
    assert "embedded Ray cluster" in tiny_run.stdout
    # GCS, raylet, object manager, workers and agents: a handful at least, or the sampling saw nothing.
    assert len(tiny_run.sockets) >= 5, tiny_run.sockets
    exposed = sorted(s for s in tiny_run.sockets if not is_loopback(s[0]))
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_main_job_exits_zero(tiny_run):
    assert tiny_run.returncode == 0, tiny_run.stderr[-4000:]


def test_main_job_writes_every_report_file(tiny_run):
    out = tiny_run.out
    for name in ("report.html", "metrics.jsonl", "config.yaml", "summary.json", *(f"{s}.png" for s in PLOTS)):
        assert (out / name).is_file(), name
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in steps if "reward" in e] == [1, 2]
    assert all("rollout/tokens_per_s" in e for e in steps if "reward" in e)


def test_report_html_names_every_plot(tiny_run):
    out = tiny_run.out
    page = (out / "report.html").read_text()
    for stem, heading in PLOTS.items():
        assert f'src="{stem}.png"' in page
        assert heading.replace("&", "&amp;") in page


def test_rollout_metrics_reach_tensorboard(tiny_run):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    out = tiny_run.out
    (events,) = (out / "tensorboard").iterdir()
    accumulator = event_accumulator.EventAccumulator(str(events))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    steps = {e["step"]: e for e in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in e}
    for key in ("rollout/tokens_per_s", "rollout/acceptance_rate", "rollout/mean_accepted_len", "rollout/gamma",
                "drafter/version", "drafter/acceptance_frozen_shadow", "weights/sync_s"):
        assert f"train/{key}" in tags, key
        for event in accumulator.Scalars(f"train/{key}"):  # the numbers the report keeps, step by step
            assert event.value == pytest.approx(steps[event.step][key], rel=1e-6), (key, event.step)
    for entry in steps.values():
        assert 0 <= entry["rollout/gamma"] <= 2 and 1 <= entry["rollout/mean_accepted_len"] <= 3  # demo_tiny: γ = 2


def test_closing_line_separates_build_time_from_run_time(tiny_run):
    (closing,) = [line for line in tiny_run.stdout.splitlines() if line.startswith("specroll train: done in")]
    assert " run " in closing and "model build" not in closing  # the session's cache holds the build


def test_every_process_runs_the_configured_torch_threads_whatever_omp_num_threads_says(tiny_run):
    """demo_tiny: `torch_threads: 1` for the driver, `num_cpus: 1` for the worker and the learner; the shell's
    OMP_NUM_THREADS=4 reaches every process (Ray passes it on) and is overridden in each."""
    threads = json.loads((tiny_run.out / "summary.json").read_text())["threads"]
    assert set(threads) == {"driver (trainer)", "rollout worker 0", "learner"}, threads
    for process, setting in threads.items():
        assert setting == {"intra_op": 1, "inter_op": 1, "OMP_NUM_THREADS": "4"}, (process, setting)
    (logged,) = [line for line in tiny_run.stdout.splitlines() if line.startswith("specroll: torch threads")]
    assert "rollout worker 0: 1 intra-op" in logged and "learner: 1 intra-op" in logged


def test_closing_lines_say_what_online_learning_bought(tiny_run):
    summary = json.loads((tiny_run.out / "summary.json").read_text())
    headline = summary["headline"]
    assert next(iter(summary)) == "headline"
    assert headline["learner_rounds"] == 2 and headline["versions_published"] >= 0
    assert "verdict" in headline
    closing = [line for line in tiny_run.stdout.splitlines() if line.startswith("specroll train: ")]
    assert any("drafter versions published in 2 learner rounds" in line for line in closing), closing
    page = (tiny_run.out / "report.html").read_text()
    assert page.index("drafter versions published") < page.index("<table>")


def test_the_run_keeps_its_final_policy_and_drafter_which_models_serves_again(tiny_run):
    """`checkpoint.final` (the default, with `checkpoint.every: 0`): `policy/` loads with `from_pretrained` with its
    tokenizer, `drafter/` (demo_tiny's drafter LM, trained online) as a Hugging Face folder; the `models:` section
    serves the two again, to the run's own greedy tokens (the policy's plain decoding) with the drafter's drafts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specroll.integrations.model_source import ModelPaths, load_drafter, tokenizer_pair
    from specroll.rollout import EngineConfig, SamplingParams, SpecEngine

    assert not (tiny_run.out / "trainer").exists() or not list((tiny_run.out / "trainer").glob("checkpoint-*"))
    policy_dir, drafter_dir = tiny_run.out / "policy", tiny_run.out / "drafter"
    policy = AutoModelForCausalLM.from_pretrained(policy_dir)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    assert AutoModelForCausalLM.from_pretrained(drafter_dir) is not None
    assert (drafter_dir / "tokenizer_config.json").is_file()
    paths = ModelPaths(str(policy_dir), str(drafter_dir))
    engine = EngineConfig(max_batch_size=4, max_seq_len=96, gamma=2)
    spec = SpecEngine(policy, load_drafter(paths, engine, policy), engine, *tokenizer_pair(paths))
    prompts = [tokenizer(text)["input_ids"] for text in ("12+34=", "7*8=", "100-1=")]
    greedy = SamplingParams(max_new_tokens=16, temperature=0, stop_token_ids=(tokenizer.eos_token_id,))
    served = [r.completion_ids for r in spec.generate(prompts, greedy)]
    plain = SpecEngine(AutoModelForCausalLM.from_pretrained(policy_dir), None, EngineConfig(max_batch_size=4,
                                                                                            max_seq_len=96, gamma=0))
    assert served == [r.completion_ids for r in plain.generate(prompts, greedy)]
    assert spec.stats.accepted > 0  # the drafter drafted, and was right some of the time
    assert "final model drafter in" in tiny_run.stdout and "drafter: " in tiny_run.stdout
