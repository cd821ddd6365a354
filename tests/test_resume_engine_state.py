"""An engine's own state through the resume path: a backend's `state_dict()` written beside a checkpoint
(`checkpoints.write_saved_run`), read back and loaded into a fresh backend gives an engine with the same suffix
history and γ statistics (`rollout.engine_state`) — and that history drafts at once, where a fresh engine has none.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_models import make_prompts, noisy_copy, tiny_lm

from specroll.integrations.local_backend import LocalBackend
from specroll.jobs.checkpoints import read_saved_run, write_saved_run
from specroll.rollout import EngineConfig, SamplingParams
from specroll.rollout.engine import engine_state, load_engine_state
from specroll.rollout.gamma.policy import StepShape

PROMPTS = make_prompts(4, 2, 6, seed=3)
GREEDY = SamplingParams(max_new_tokens=16, temperature=0)
CONFIG = EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto_simple", max_gamma=4, drafters=("suffix", "model"),
                      cost_model_budget_s=0.5)


# A fixed γ for the drafting check: auto-γ's choice rests on forward times measured on the machine (in a test
# process that ran other engines first it chose γ = 0 for most steps, and no draft could show the history).
FIXED = dataclasses.replace(CONFIG, gamma=4)


def backend(config: EngineConfig = CONFIG) -> LocalBackend:
    torch.manual_seed(0)
    return LocalBackend.from_models(tiny_lm("llama"), noisy_copy("llama"), config)


def same(a, b) -> bool:
    """Plain data and tensors compared all the way down."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def generated_and_saved(config: EngineConfig, tmp_path_factory):
    """A backend that generated twice, and its state read back from a checkpoint folder."""
    first = backend(config)
    for _ in range(2):
        first.generate(PROMPTS, GREEDY, n=2)
    folder = tmp_path_factory.mktemp("run") / "trainer" / "checkpoint-2"
    folder.mkdir(parents=True)
    write_saved_run(folder, {"step": 2}, first.state_dict())
    return first, read_saved_run(folder).backend_state()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return generated_and_saved(CONFIG, tmp_path_factory)


@pytest.fixture(scope="module")
def saved_fixed(tmp_path_factory):
    return generated_and_saved(FIXED, tmp_path_factory)


def test_a_loaded_engine_has_the_saved_suffix_history_and_gamma_statistics(saved):
    first, state = saved
    second = backend()
    second.load_state_dict(state)
    before, after = engine_state(first.engine), engine_state(second.engine)
    assert before["suffix"]["index"]["groups"], "nothing was saved: the test would prove nothing"
    assert any(before["gamma"]["acceptance"][True]["reached"])
    assert same(before, after)
    assert second.metrics()["rollout/total_rollouts"] == first.metrics()["rollout/total_rollouts"] == 16


def test_the_loaded_history_drafts_from_the_first_call(saved_fixed):
    _, state = saved_fixed
    loaded, fresh = backend(FIXED), backend(FIXED)
    loaded.load_state_dict(state)
    outputs = [b.generate(PROMPTS, GREEDY, n=1) for b in (loaded, fresh)]
    assert [r.completion_ids for r in outputs[0]] == [r.completion_ids for r in outputs[1]]  # speed, never tokens
    kept = [b.batch_stats().by_drafter.get("suffix") for b in (loaded, fresh)]
    # Greedy completions repeat the saved ones: the loaded history drafts them; a fresh engine has only the
    # row's own text to match.
    assert kept[0] is not None and kept[0].accepted > 2 * (kept[1].accepted if kept[1] else 0) + 4


def test_another_gamma_policy_is_refused_naming_it(saved):
    _, state = saved
    other = LocalBackend.from_models(tiny_lm("llama"), noisy_copy("llama"),
                                     EngineConfig(max_batch_size=4, max_seq_len=64, gamma=2,
                                                  drafters=("suffix", "model")))
    with pytest.raises(ValueError, match="γ policy is SimpleGamma, this engine's FixedGamma"):
        load_engine_state(other.engine, state["engines"][0])


def test_a_loaded_engine_has_the_saved_tree_statistics(tmp_path_factory):
    trees = EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto", max_gamma=3, tree_width="auto",
                         max_tree_width=3, cost_model_budget_s=0.5)
    first = backend(trees)
    first.generate(PROMPTS, GREEDY, n=2)
    # What the tree policy learns rests on the machine's timing (auto-γ may decode plain in a busy test process):
    # one tree step shown to it makes its state something to compare, whatever the generate chose.
    first.engine.tree_policy.observe(StepShape(3), 2, 2, [1, 2, 0], [2, 2, 1], 0.01, greedy=True)
    folder = tmp_path_factory.mktemp("run") / "trainer" / "checkpoint-1"
    folder.mkdir(parents=True)
    write_saved_run(folder, {"step": 1}, first.state_dict())
    saved_tree = engine_state(first.engine)["tree"]
    assert saved_tree["offsets"] and any(any(r["reached"]) for r in saved_tree["rates"]["True"].values())
    second = backend(trees)
    second.load_state_dict(read_saved_run(folder).backend_state())
    assert same(engine_state(second.engine)["tree"], saved_tree)
