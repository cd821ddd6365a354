"""The demo reward: strict exact-match scoring with a brevity bonus, in TRL's call shape."""

import pytest

from specroll.demo.reward import RewardConfig, arithmetic_reward, make_reward, score
from specroll.demo.task import Problem, Style, solution

PROBLEM = Problem(457, 68)
PROMPT = [{"role": "user", "content": "457+68"}]
COMPACT = solution(PROBLEM, Style.COMPACT)
VERBOSE = solution(PROBLEM, Style.VERBOSE)


def test_right_compact_scores_one_and_right_verbose_scores_less():
    compact, verbose = arithmetic_reward([PROMPT, PROMPT], [COMPACT, VERBOSE])
    assert compact == 1.0
    assert verbose == pytest.approx(len(COMPACT) / len(VERBOSE))
    assert 0 < verbose < compact


def test_brevity_zero_rewards_correctness_alone():
    assert score(PROBLEM, VERBOSE, RewardConfig(brevity=0.0)) == 1.0
    assert score(PROBLEM, VERBOSE, RewardConfig(brevity=0.5)) == pytest.approx(0.5 + 0.5 * len(COMPACT) / len(VERBOSE))


def test_wrong_answer_scores_zero():
    assert score(PROBLEM, "45+6|15;4+0|125;0+0|0525;>526") == 0.0


def test_right_answer_after_wrong_work_scores_zero():
    assert score(PROBLEM, "45+6|15;4+0|135;0+0|0525;>525") == 0.0


@pytest.mark.parametrize("text", [
    "525", ">525", "45+6|15;4+0|125;0+0|0525; >525", "45+6|15;4+0|125;0+0|0525;>525;>525",
    "45+6 c1 r5;4+0|125;0+0|0525;>525", "45+6|15 4+0|125 0+0|0525 >525",
])
def test_malformed_scores_zero(text):
    assert score(PROBLEM, text) == 0.0


def test_empty_scores_zero():
    assert arithmetic_reward([PROMPT], [""]) == [0.0]
    assert arithmetic_reward([PROMPT], [[{"role": "assistant", "content": ""}]]) == [0.0]


def test_overlong_scores_zero():
    assert score(PROBLEM, VERBOSE + " " * 3 + "x" * 600) == 0.0
    assert score(PROBLEM, VERBOSE, RewardConfig(max_completion_chars=len(VERBOSE) - 1)) == 0.0


def test_trailing_whitespace_is_tolerated():
    assert score(PROBLEM, COMPACT + "\n") == 1.0


def test_conversational_completions_and_string_prompts_are_accepted():
    rewards = make_reward()(
        prompts=["<s><|user|>457+68<|assistant|>"],
        completions=[[{"role": "assistant", "content": COMPACT}]],
        completion_ids=[[1, 2, 3]],
    )
    assert rewards == [1.0]


def test_mismatched_batch_raises():
    with pytest.raises(ValueError, match="pair up"):
        arithmetic_reward([PROMPT], [COMPACT, COMPACT])


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"brevity=1\.5"):
        RewardConfig(brevity=1.5)


def test_format_bonus_pays_the_compact_grammar_right_or_wrong():
    config = RewardConfig(format_bonus=0.5)
    assert score(PROBLEM, COMPACT, config) == pytest.approx(1.5)
    assert score(PROBLEM, "45+6|15;4+0|125;0+0|0525;>526", config) == pytest.approx(0.5)  # wrong, compact
    assert score(PROBLEM, VERBOSE, config) == pytest.approx(len(COMPACT) / len(VERBOSE))  # no bonus
    assert score(PROBLEM, "525", config) == 0.0  # neither grammar
    with pytest.raises(ValueError, match="format_bonus"):
        RewardConfig(format_bonus=-1.0)
