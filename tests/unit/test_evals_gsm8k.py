"""GSM8K: the loader over the offline copy and the grader (numbers compared as numbers)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from evals_data import shared_data_dir

from rstar.evals import get_benchmark
from rstar.evals.answers import RELEASED_EXTRACTION, AnswerView
from rstar.evals.gsm8k import gold_answer, stated_number

GSM8K = get_benchmark("gsm8k")


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return GSM8K.load(shared_data_dir())


def test_the_test_split_loads_with_integer_gold_answers(docs):
    assert len(docs) == 1319 and len({d["id"] for d in docs}) == 1319
    assert docs[0]["problem"].startswith("Janet") and docs[0]["answer"] == "18"
    assert all(int(d["answer"]) == Fraction(d["answer"]) for d in docs)
    assert sum("," in d["answer"] for d in docs) == 0  # 14 gold answers are written with separators: stripped
    assert sum(d["answer"].startswith("-") for d in docs) == 2


def test_gold_answer_is_the_number_after_the_last_marker():
    assert gold_answer("She pays 2*3=<<2*3=6>>6.\n#### 1,000") == "1000"
    assert gold_answer("#### -3") == "-3"
    with pytest.raises(ValueError, match="####"):
        gold_answer("The answer is 6.")


@pytest.mark.parametrize(
    ("answer", "number"),
    [
        ("18", 18),
        ("1,000", 1000),
        ("$18.00", 18),
        ("\\$18", 18),
        ("18 dollars", 18),
        ("\\text{18 eggs}", 18),
        ("50\\%", 50),
        ("-3", -3),
        ("2.5", Fraction(5, 2)),
        ("\\frac{36}{2}", 18),
        ("\\dfrac{3}{4}", Fraction(3, 4)),
        ("-\\frac{1}{2}", Fraction(-1, 2)),
        ("36/2", 18),
        ("3 \\times 6 = 18", 18),
        ("The total is 18.", 18),
        ("3, 4", 4),  # not a thousands group: two numbers, the last one stated
        ("1{,}080", 1080),
    ],
)
def test_stated_number(answer, number):
    assert stated_number(answer) == number


@pytest.mark.parametrize("answer", [None, "", "x", "\\frac{1}{0}", "1/0"])
def test_no_number_is_stated(answer):
    assert stated_number(answer) is None


def test_the_grade_reads_the_boxed_answer(docs):
    janet = docs[0]  # gold 18
    assert GSM8K.grade(janet, "<answer>She makes \\boxed{\\$18} a day.</answer>", 0).score == 1.0
    assert GSM8K.grade(janet, "<answer>\\boxed{18.0}</answer>", 0).score == 1.0
    assert GSM8K.grade(janet, "<answer>\\boxed{16}</answer> 18", 0).score == 0.0  # the box is the answer, not the prose
    assert GSM8K.grade(janet, "She makes 18 dollars a day.", 0).score == 0.0  # no box: the paper's rule finds no answer
    big = next(d for d in GSM8K.load(shared_data_dir()) if int(d["answer"]) >= 1000)
    written = f"{int(big['answer']):,}"
    assert GSM8K.grade(big, f"<answer>\\boxed{{{written}}}</answer>", 0).score == 1.0


def test_the_released_extraction_reads_the_marker_without_a_box(docs):
    view = AnswerView(reasoning="", content="So the answer is 18.")
    grade = GSM8K.grade_view(docs[0], view, 0, RELEASED_EXTRACTION)
    assert grade.score == 1.0 and grade.details["extraction"] == RELEASED_EXTRACTION
