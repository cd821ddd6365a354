"""The demo task: problem sampling, canonical solutions in both styles, parsing prompts back."""

import pytest

from specroll.demo.task import Problem, Style, make_problems, make_prompts, parse_problem, solution, style_of


def test_solutions_in_both_styles_peel_columns_from_the_right():
    problem = Problem(457, 68)
    assert solution(problem, Style.VERBOSE) == "45+6 c1 r5;4+0 c1 r25;0+0 c0 r525;>525"
    assert solution(problem, Style.COMPACT) == "45+6|15;4+0|125;0+0|0525;>525"


def test_final_carry_makes_the_answer_one_digit_longer():
    assert solution(Problem(95, 7), Style.COMPACT) == "9+0|12;0+0|102;>102"
    assert solution(Problem(9, 5), Style.VERBOSE) == "0+0 c1 r4;>14"


def test_work_grows_quadratically_with_digits():
    short = len(solution(Problem(12, 34), Style.VERBOSE))
    assert len(solution(Problem(12345678, 87654321), Style.VERBOSE)) > 6 * short


def test_style_of_recognises_each_grammar_and_nothing_else():
    problem = Problem(1234, 99)
    assert style_of(solution(problem, Style.VERBOSE)) is Style.VERBOSE
    assert style_of(solution(problem, Style.COMPACT)) is Style.COMPACT
    assert style_of("1333") is None
    assert style_of("") is None


def test_make_problems_is_reproducible_and_long_tailed():
    problems = make_problems(2000, seed=7, max_digits=8)
    assert problems == make_problems(2000, seed=7, max_digits=8)
    lengths = sorted(len(solution(p, Style.VERBOSE)) for p in problems)
    assert max(p.num_columns for p in problems) == 8
    assert lengths[len(lengths) * 9 // 10] >= 2.5 * lengths[len(lengths) // 2]


def test_prompts_are_conversational_and_parse_back():
    prompts = make_prompts(5, seed=0, max_digits=4)
    problems = make_problems(5, seed=0, max_digits=4)
    assert [parse_problem(p) for p in prompts] == problems
    assert prompts[0] == [{"role": "user", "content": problems[0].text}]


def test_parse_problem_reads_plain_and_templated_strings():
    assert parse_problem("12+345") == Problem(12, 345)
    assert parse_problem("<s><|user|>12+345<|assistant|>") == Problem(12, 345)


def test_parse_problem_rejects_a_prompt_without_a_problem():
    with pytest.raises(ValueError, match="no addition problem"):
        parse_problem([{"role": "user", "content": "hello"}])


def test_problem_rejects_negative_operands():
    with pytest.raises(ValueError, match="a=-1"):
        Problem(-1, 2)
