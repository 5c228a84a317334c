"""Answer extraction and checking, in process and inside the pool with its timeout."""

from __future__ import annotations

import pytest

from rstar.sandbox.verify import answers_match, boxed_contents, extract_answer, score


def test_boxed_contents_balance_nested_braces():
    assert boxed_contents(r"a \boxed{\frac{1}{2}} b \boxed{x_{1}}") == [r"\frac{1}{2}", "x_{1}"]
    assert boxed_contents(r"\boxed{unclosed {") == []


def test_answer_tag_box_comes_first():
    text = r"<reason>try \boxed{1}</reason><answer>so \boxed{42}</answer> and later \boxed{7}"
    assert extract_answer(text) == "42"


def test_last_box_when_the_answer_tag_has_none():
    assert extract_answer(r"\boxed{1} then \boxed{2} <answer>two</answer>") == "2"
    assert extract_answer(r"no box here <answer>5</answer>") is None


@pytest.mark.parametrize("predicted, gold", [
    ("025", "25"), ("25", "025"), ("1,000", "1000"), ("-7", "-7"), (r"\frac{1}{2}", "0.5"),
    (r"2\sqrt{2}", r"\sqrt{8}"), ("x^2+1", "1+x^2"), (r"\text{12}", "12"),
])
def test_equal_answers(predicted, gold):
    assert answers_match(predicted, gold)


@pytest.mark.parametrize("predicted, gold", [("24", "25"), (r"\frac{1}{3}", "0.5"), ("x^2", "x^3"), ("", "1")])
def test_different_answers(predicted, gold):
    assert not answers_match(predicted, gold)


def test_score_combines_extraction_and_comparison():
    assert score(r"<answer>The answer is \boxed{025}.</answer>", "25")
    assert not score("I think it is 25", "25")  # no boxed answer: nothing to check


def test_verify_in_the_pool(sandbox_pool):
    right = sandbox_pool.call(sandbox_pool.pool.verify(r"<answer>\boxed{\dfrac{3}{6}}</answer>", "0.5"))
    assert (right.correct, right.status) == (True, "ok")
    wrong = sandbox_pool.call(sandbox_pool.pool.verify(r"\boxed{7}", "8"))
    assert (wrong.correct, wrong.status) == (False, "ok")


def test_verify_times_out_on_a_pathological_answer(sandbox_pool):
    result = sandbox_pool.call(sandbox_pool.pool.verify(r"\boxed{9^{9^{9^{9^{9}}}}}", r"\frac{1}{3}", timeout_s=1.0))
    assert (result.correct, result.status) == (False, "timeout")
    assert sandbox_pool.call(sandbox_pool.pool.verify(r"\boxed{3}", "3")).correct


def test_verify_rejects_non_strings(sandbox_pool):
    result = sandbox_pool.call(sandbox_pool.pool.verify(None, "3"))
    assert (result.correct, result.status) == (False, "invalid_input")


# Golden cases where the two reward rules disagree (and two where they agree), each written down from the rule.
@pytest.mark.parametrize(
    ("response", "gold", "boxed", "released"),
    [
        ("<answer>\n42\n</answer>", "42", False, True),  # no box: the paper's rule finds no answer, math-verify finds 42
        (r"<answer>\boxed{3}</answer> then \boxed{4}", "4", False, True),  # boxed reads <answer>'s box, released the last
        (r"<answer>\boxed{3}</answer> then \boxed{4}", "3", True, False),
        ("The answer is 12.", "12", False, True),  # prime_math's "answer is" marker
        (r"<answer>\boxed{1,000}</answer>", "1000", True, True),  # a thousands separator
        (r"<answer>\boxed{3,5}</answer>", "35", False, False),  # two numbers, not thirty-five
    ],
)
def test_reward_rules(response, gold, boxed, released):
    assert (score(response, gold, "boxed"), score(response, gold, "released")) == (boxed, released)


def test_an_unknown_rule_is_refused(sandbox_pool):
    with pytest.raises(ValueError, match="unknown reward rule 'prime'"):
        score(r"\boxed{1}", "1", "prime")
    refused = sandbox_pool.call(sandbox_pool.pool.verify(r"\boxed{1}", "1", rule="prime"))
    assert (refused.correct, refused.status) == (False, "invalid_input") and "boxed, released" in refused.detail


def test_the_pool_checks_by_the_rule_it_is_given(sandbox_pool):
    text = "<answer>\n42\n</answer>"
    assert not sandbox_pool.call(sandbox_pool.pool.verify(text, "42")).correct  # boxed, the pool's default
    released = sandbox_pool.call(sandbox_pool.pool.verify(text, "42", rule="released"))
    assert (released.correct, released.status) == (True, "ok")
