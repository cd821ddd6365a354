"""The suffix drafter and the per-row choice between drafters: greedy exactness, the index, history.

Greedy siblings of one prompt are identical, so with n > 1 the suffix drafter has long matches from
the second sibling on (and from the first one on in a second call, from history): these tests check
that its drafts are used, and that using them never changes a token.
"""

from __future__ import annotations

import random

import pytest
import torch
from tiny_models import make_prompts, noisy_copy, tiny_lm

from specroll.rollout import EngineConfig, SamplingParams, SpecEngine
from specroll.rollout.config import SuffixConfig
from specroll.rollout.core.batch import HostStep, RowBuffers
from specroll.rollout.drafters.suffix import SuffixDrafter
from specroll.rollout.drafters.suffix_or_model import SuffixOrModelDrafter
from specroll.rollout.drafters.version import DrafterVersion

PROMPTS = make_prompts(6, 2, 7, seed=5)
GREEDY = SamplingParams(max_new_tokens=20, temperature=0)


def plain(arch: str, attn: str, prompts, n: int) -> list[list[int]]:
    engine = SpecEngine(tiny_lm(arch, attn), None, EngineConfig(max_batch_size=4, max_seq_len=64, gamma=0))
    return [r.completion_ids for r in engine.generate(prompts, GREEDY, n=n)]


@pytest.mark.parametrize(("drafters", "gamma", "arch", "attn"), [
    (("suffix",), 4, "llama", "sdpa"), (("suffix",), 8, "qwen2", "eager"),
    (("suffix", "model"), 3, "qwen3", "sdpa"), (("suffix", "model"), 6, "llama", "eager"),
])
def test_greedy_output_equals_plain_decoding(drafters, gamma, arch, attn):
    reference = plain(arch, attn, PROMPTS, n=3)
    config = EngineConfig(max_batch_size=4, max_seq_len=64, gamma=gamma, drafters=drafters)
    engine = SpecEngine(tiny_lm(arch, attn), noisy_copy(arch, attn) if "model" in drafters else None, config)
    for _ in range(2):  # the second call drafts from the first one's history too
        assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY, n=3)] == reference
    suffix = engine.stats.by_drafter["suffix"]
    assert suffix.accepted > 0.5 * suffix.drafted > 0  # siblings agree: most suffix drafts are kept
    if "model" in drafters:
        assert engine.stats.by_drafter["model"].proposals > 0


def test_history_carries_across_calls():
    config = EngineConfig(max_batch_size=8, max_seq_len=64, gamma=6, drafters=("suffix",))
    engine = SpecEngine(tiny_lm("llama"), None, config)
    engine.generate(PROMPTS, GREEDY)
    first = engine.stats.by_drafter.get("suffix")
    engine.stats.reset()
    engine.generate(PROMPTS, GREEDY)  # one sample per prompt: no siblings, only history
    again = engine.stats.by_drafter["suffix"]
    assert again.acceptance_rate > 0.9
    assert first is None or again.accepted > 2 * first.accepted


def _drafter(slots: int = 2, **config) -> tuple[SuffixDrafter, RowBuffers]:
    rows = RowBuffers(slots, 64, torch.device("cpu"), None)
    return SuffixDrafter(slots, 16, torch.device("cpu"), SuffixConfig(**config)), rows


def _start(drafter: SuffixDrafter, rows: RowBuffers, slot: int, prompt: list[int]) -> None:
    rows.load(slot, prompt, 40, key=0)
    drafter.prefill(torch.tensor([slot]), rows, torch.tensor([len(prompt) - 1]))


def _append(drafter: SuffixDrafter, rows: RowBuffers, tokens: list[list[int]]) -> None:
    """Append tokens[b] to row b and let the drafter index them."""
    n = len(tokens)
    seq_len = rows.seq_len[:n].clone()
    rows.last_step = HostStep(seq_len=rows.host_seq_len[:n], accepted_len=[0] * n, drafted_len=[0] * n,
                              appended=[list(new) for new in tokens])  # what a step's host copy says
    for b, new in enumerate(tokens):
        start = rows.host_seq_len[b]
        rows.tokens[b, start : start + len(new)] = torch.tensor(new, dtype=torch.long)
        rows.host_seq_len[b] = start + len(new)
        rows.seq_len[b] = start + len(new)
    drafter.keep(slice(0, n), rows, seq_len, torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long))


def test_proposes_what_followed_the_longest_match_in_a_sibling():
    drafter, rows = _drafter(min_survival=0.0)
    _start(drafter, rows, 0, [1, 2])
    _start(drafter, rows, 1, [1, 2])
    _append(drafter, rows, [[5, 6, 7, 8, 9, 5, 6, 3, 4], [9]])
    _append(drafter, rows, [[], [5, 6]])
    found = drafter.lookup(2, gamma=3)
    # Row 1 ends "... 9 5 6": in row 0 "9 5 6" (3 tokens) is followed by "3 4", "5 6" alone by "7 8 9".
    assert found.drafts[1] == [3, 4] and found.match[1] == 3
    proposal = drafter.to_proposal(found, 3)
    assert proposal.lengths.tolist() == [len(found.drafts[0]), 2]
    q = proposal.q.expanded(proposal.drafts)  # [n, γ, V]
    assert torch.equal(q[1, :2].argmax(-1), torch.tensor([3, 4]))
    assert torch.all(q.sum(-1) == 1)  # point masses, padded to γ = 3


def test_prompts_do_not_share_drafts():
    drafter, rows = _drafter(min_survival=0.0)
    _start(drafter, rows, 0, [1, 2])
    _start(drafter, rows, 1, [1, 3])
    _append(drafter, rows, [[5, 6, 7], [5]])
    assert drafter.lookup(2, gamma=2).drafts[1] == []  # "5 6 7" belongs to another prompt


def test_history_is_bounded_per_prompt_and_in_all():
    drafter, rows = _drafter(slots=1, prompt_history_tokens=30, history_tokens=40, max_match=4)
    for prompt in ([1, 2], [1, 2], [1, 2], [3, 4], [5, 6]):
        _start(drafter, rows, 0, prompt)
        _append(drafter, rows, [list(range(6, 16))])
        assert all(group.tokens <= 30 for group in drafter.index.groups.values())
        assert drafter.index.tokens <= 40
    assert (1, 2) not in drafter.index.groups  # the least recently used prompt went first
    assert sum(group.tokens for group in drafter.index.groups.values()) == drafter.index.tokens


def test_engine_takes_any_drafter_object():
    target = tiny_lm("llama")
    config = EngineConfig(max_batch_size=4, max_seq_len=64, gamma=4)
    drafter = SuffixDrafter(4, target.config.vocab_size, torch.device("cpu"))
    engine = SpecEngine(target, drafter, config)
    assert engine.drafter is drafter
    assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY, n=2)] == plain("llama", "sdpa", PROMPTS, 2)
    with pytest.raises(ValueError, match="drafters"):
        SpecEngine(target, drafter, EngineConfig(max_batch_size=4, drafters=("suffix",)))
    with pytest.raises(ValueError, match="load_drafter"):
        engine.load_drafter(DrafterVersion(1, {"weight": torch.zeros(1)}))


def test_model_kind_needs_a_drafter_model():
    with pytest.raises(ValueError, match=r"drafters=.*'model' needs a drafter LM"):
        SpecEngine(tiny_lm("llama"), None, EngineConfig(max_batch_size=2, drafters=("suffix", "model")))
    with pytest.raises(ValueError, match="drafters"):
        EngineConfig(drafters=("suffix", "ngram"))


def test_multi_drafter_runs_the_model_only_for_rows_that_take_it():
    config = EngineConfig(max_batch_size=8, max_seq_len=64, gamma=4, drafters=("suffix", "model"))
    engine = SpecEngine(tiny_lm("llama"), noisy_copy("llama"), config)
    assert isinstance(engine.drafter, SuffixOrModelDrafter)
    engine.generate(PROMPTS[:2], GREEDY, n=4)
    engine.stats.reset()
    forwards = engine.drafter.num_forwards
    engine.generate(PROMPTS[:2], GREEDY, n=4)  # history covers every row: the suffix serves many
    shares = engine.stats.by_drafter
    assert shares["suffix"].proposals > 0.3 * (shares["suffix"].proposals + shares["model"].proposals)
    assert engine.drafter.num_forwards - forwards < 4 * engine.stats.steps  # steps without a model forward


def test_calibration_asks_the_drafter_for_its_cost(tmp_path):
    target = tiny_lm("llama")
    config = EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto", max_gamma=3,
                          calibration_cache=str(tmp_path), cost_model_budget_s=1.0)
    drafter = SuffixDrafter(4, target.config.vocab_size, torch.device("cpu"))
    asked = []
    measure = drafter.time_drafts
    drafter.time_drafts = lambda sizes, deadline: asked.append(sizes) or measure(sizes, deadline)
    engine = SpecEngine(target, drafter, config)
    assert asked and engine.gamma_policy.cost.drafter.batch_sizes == asked[0]
    assert all(t < 1e-2 for row in engine.gamma_policy.cost.drafter.times for t in row)  # lookups, no model


def test_narrowed_proposals_keep_greedy_output(tmp_path):
    """With auto-γ the policy may verify fewer columns than were proposed (`GammaPolicy.narrow`): here
    it asks for γ = 6 and cuts each proposal to a random width (its real choice depends on timings)."""
    reference = plain("qwen2", "sdpa", PROMPTS, n=3)
    config = EngineConfig(max_batch_size=4, max_seq_len=64, gamma="auto", max_gamma=6, drafters=("suffix", "model"),
                          calibration_cache=str(tmp_path), cost_model_budget_s=1.0)
    engine = SpecEngine(tiny_lm("qwen2", "sdpa"), noisy_copy("qwen2", "sdpa"), config)
    rng, widths = random.Random(0), []
    engine.gamma_policy.choose = lambda shape, greedy: 6
    engine.gamma_policy.narrow = lambda shape, kept: widths.append(rng.randrange(len(kept))) or widths[-1]
    for _ in range(2):
        assert [r.completion_ids for r in engine.generate(PROMPTS, GREEDY, n=3)] == reference
    assert set(widths) == set(range(7))
    assert set(engine.stats.gamma_per_step) == set(range(7))  # the step verified the narrowed width
    assert engine.stats.by_drafter["suffix"].accepted > 0 and engine.stats.by_drafter["model"].accepted > 0


def test_drafters_and_suffix_settings_load_from_yaml(tmp_path):
    from specroll.integrations.yaml_config import ConfigError, load_config

    path = tmp_path / "engine.yaml"
    path.write_text("drafters: [suffix, model]\nsuffix: {min_survival: 0.4, history_tokens: 10000}\n")
    config = load_config(path, EngineConfig)
    assert config.drafters == ("suffix", "model")
    assert config.suffix == SuffixConfig(min_survival=0.4, history_tokens=10000)
    path.write_text("drafters: [suffix, ngram]\n")
    with pytest.raises(ConfigError, match="drafters"):
        load_config(path, EngineConfig)
