"""GPQA-Diamond: seeded option shuffles, letter extraction from odd formats, grading.

The questions must never appear in test output, so grading tests use synthetic rows, and the real file is
only checked by counts and shapes (never by comparing text that an assertion message would print).
"""

from __future__ import annotations

from collections import Counter

import pytest
from evals_data import shared_data_dir

from rstar.evals import get_benchmark
from rstar.evals.gpqa import LETTERS, extract_letter, permutation

BENCH = get_benchmark("gpqa_diamond")
SYNTHETIC = {
    "id": "synthetic-1",
    "question": "Which colour do you get by mixing blue and yellow paint?",
    "options": ["green", "purple", "orange", "brown"],  # options[0] is the correct one
    "domain": "Art",
}


def correct_letter(sample_index: int) -> str:
    return LETTERS[permutation(SYNTHETIC["id"], sample_index).index(0)]


def wrong_letter(sample_index: int) -> str:
    return next(letter for letter in LETTERS if letter != correct_letter(sample_index))


def test_permutation_is_seeded_per_doc_and_sample():
    assert permutation("rec1", 3) == permutation("rec1", 3)
    orders = {tuple(permutation("rec1", i)) for i in range(32)}
    assert len(orders) > 10  # samples of one question see different orders
    assert permutation("rec1", 0) != permutation("rec2", 0) or permutation("rec1", 1) != permutation("rec2", 1)
    for i in range(32):
        assert sorted(permutation("rec1", i)) == [0, 1, 2, 3]


def test_correct_option_lands_on_every_letter_about_equally():
    counts = Counter(LETTERS[permutation(f"doc{d}", 0).index(0)] for d in range(2000))
    assert set(counts) == set(LETTERS)
    assert all(400 < n < 600 for n in counts.values()), counts


def test_prompt_shows_options_in_the_sample_order():
    for sample in range(4):
        content = BENCH.build_prompt(SYNTHETIC, sample).messages[0]["content"]
        assert f"{correct_letter(sample)}) green" in content
        lines = [line for line in content.splitlines() if line[:3] in {"A) ", "B) ", "C) ", "D) "}]
        assert [line[0] for line in lines] == list("ABCD")


@pytest.mark.parametrize(
    "template",
    [
        "<answer>The answer is \\boxed{{{L}}}</answer>",
        "<answer>\\boxed{{\\text{{({L})}}}}</answer>",
        "\\boxed{{\\textbf{{{L}}}}}",
        "\\boxed{{{l}}}",
        "\\boxed{{{L}) green}}",
        "\\boxed{{Option {L}}}",
        "$\\boxed{{\\mathrm{{{L}}}}}$",
        "Reasoning...\nAnswer: {L}",
        "**Answer:** ({L})",
        "so the answer is {L}.",
        "Answer: {l}",
    ],
)
def test_letter_in_odd_formats_is_graded_correct(template):
    for sample in range(3):
        letter = correct_letter(sample)
        response = template.format(L=letter, l=letter.lower())
        grade = BENCH.grade(SYNTHETIC, response, sample)
        assert grade.score == 1.0, (response, grade.details)
        assert grade.details["predicted"] == letter


def test_boxed_option_text_counts_as_that_option():
    assert BENCH.grade(SYNTHETIC, "<answer>\\boxed{Green}</answer>", 0).score == 1.0
    assert BENCH.grade(SYNTHETIC, "<answer>\\boxed{purple}</answer>", 0).score == 0.0


def test_wrong_missing_and_ambiguous_answers_score_zero():
    assert BENCH.grade(SYNTHETIC, f"\\boxed{{{wrong_letter(0)}}}", 0).score == 0.0
    assert BENCH.grade(SYNTHETIC, "I am not sure.", 0).details["predicted"] is None
    # "a" in running text is an article, not option A
    assert extract_letter("the answer is a colour we all know", SYNTHETIC["options"]) is None
    # a box cut off by the token limit is not an answer
    assert extract_letter("\\boxed{\\text{", SYNTHETIC["options"]) is None


def test_answer_inside_answer_tags_wins_over_earlier_boxes():
    response = f"Maybe \\boxed{{{wrong_letter(0)}}}... <answer>\\boxed{{{correct_letter(0)}}}</answer>"
    assert BENCH.grade(SYNTHETIC, response, 0).score == 1.0
    # without <answer>, the last box counts
    response = f"\\boxed{{{correct_letter(0)}}} then on reflection \\boxed{{{wrong_letter(0)}}}"
    assert BENCH.grade(SYNTHETIC, response, 0).score == 0.0


def test_grade_records_the_permutation():
    grade = BENCH.grade(SYNTHETIC, "\\boxed{A}", 5)
    assert grade.details["permutation"] == permutation(SYNTHETIC["id"], 5)
    assert grade.details["gold"] == correct_letter(5)
    assert "question" not in grade.details and "options" not in grade.details


def test_loads_the_diamond_csv():
    docs = BENCH.load(shared_data_dir())
    assert len(docs) == 198
    assert len({d["id"] for d in docs}) == 198
    assert all(len(d["options"]) == 4 and all(d["options"]) for d in docs)
    assert Counter(d["domain"] for d in docs) == {"Chemistry": 93, "Physics": 86, "Biology": 19}
    # its own correct option, boxed, grades 1 on a real row (no text is compared in an assertion)
    doc = docs[0]
    order = permutation(doc["id"], 0)
    assert BENCH.grade(doc, f"\\boxed{{{LETTERS[order.index(0)]}}}", 0).score == 1.0
