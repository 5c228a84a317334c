"""AIME24, AIME25, HMMT Feb 2025 and MATH-500: loaders over the offline copies and the grader (the sandbox's check)."""

from __future__ import annotations

import pytest
from evals_data import shared_data_dir

from rstar.evals import get_benchmark

AIME24, AIME25, HMMT, MATH500 = (get_benchmark(n) for n in ("aime24", "aime25", "hmmt_feb_2025", "math500"))


@pytest.fixture(scope="module")
def hmmt() -> dict[str, dict]:
    return {d["id"]: d for d in HMMT.load(shared_data_dir())}


def test_each_set_has_30_problems_with_answers():
    for bench in (AIME24, AIME25, HMMT):
        docs = bench.load(shared_data_dir())
        assert len(docs) == 30 and len({d["id"] for d in docs}) == 30, bench.name
        assert all(d["problem"] and d["answer"] for d in docs), bench.name


def test_prompt_is_the_bare_problem():
    doc = AIME25.load(shared_data_dir())[0]
    assert AIME25.build_prompt(doc, 3).messages == [{"role": "user", "content": doc["problem"]}]
    assert AIME25.build_prompt(doc, 3).tools is None  # the rStar template offers the python tool


def test_zero_padded_aime_answers_compare_as_integers():
    padded = [d for d in AIME24.load(shared_data_dir()) if d["answer"].startswith("0")]
    assert len(padded) == 7
    for doc in padded:
        unpadded = str(int(doc["answer"]))
        assert AIME24.grade(doc, f"<answer>\\boxed{{{unpadded}}}</answer>", 0).score == 1.0
        assert AIME24.grade(doc, f"<answer>\\boxed{{{doc['answer']}}}</answer>", 0).score == 1.0
        assert AIME24.grade(doc, f"<answer>\\boxed{{{int(unpadded) + 1}}}</answer>", 0).score == 0.0


def test_every_gold_answer_grades_itself_and_rejects_a_neighbour():
    for bench in (AIME24, AIME25):
        for doc in bench.load(shared_data_dir()):
            assert bench.grade(doc, f"So the total is \\boxed{{{doc['answer']}}}.", 0).score == 1.0
            assert bench.grade(doc, f"\\boxed{{{int(doc['answer']) + 1}}}", 0).score == 0.0


@pytest.mark.parametrize(
    ("doc_id", "equivalent", "wrong"),
    [
        ("10", "\\frac{-1-\\sqrt{17}}{2}, \\frac{-1+\\sqrt{17}}{2}", "\\frac{-1+\\sqrt{17}}{2}"),  # two values, any order
        ("7", "\\frac{9}{\\sqrt{23}}", "\\frac{9\\sqrt{23}}{22}"),
        ("25", "-2\\sqrt{3}+\\sqrt{23}", "\\sqrt{23}+2\\sqrt{3}"),
        ("30", "\\frac{\\sqrt{570}}{12}", "\\frac{\\sqrt{570}}{11}"),
    ],
)
def test_hmmt_symbolic_answers(hmmt, doc_id, equivalent, wrong):
    doc = hmmt[doc_id]
    assert HMMT.grade(doc, f"<answer>\\boxed{{{doc['answer']}}}</answer>", 0).score == 1.0
    assert HMMT.grade(doc, f"<answer>\\boxed{{{equivalent}}}</answer>", 0).score == 1.0
    assert HMMT.grade(doc, f"<answer>\\boxed{{{wrong}}}</answer>", 0).score == 0.0


def test_hmmt_equivalent_forms_of_symbolic_answers(hmmt):
    by_answer = {d["answer"]: d for d in hmmt.values()}
    doc = by_answer["1-\\frac{2}{\\pi}"]
    assert HMMT.grade(doc, "\\boxed{\\frac{\\pi-2}{\\pi}}", 0).score == 1.0
    assert HMMT.grade(doc, "\\boxed{1-\\frac{1}{\\pi}}", 0).score == 0.0
    factorial = by_answer["2^{25} \\cdot 26!"]
    assert HMMT.grade(factorial, "\\boxed{26! \\cdot 2^{25}}", 0).score == 1.0
    assert HMMT.grade(factorial, "\\boxed{2^{24} \\cdot 26!}", 0).score == 0.0


def test_answer_tag_wins_and_missing_answer_scores_zero(hmmt):
    doc = AIME25.load(shared_data_dir())[0]
    right, wrong = doc["answer"], str(int(doc["answer"]) + 1)
    grade = AIME25.grade(doc, f"<answer>\\boxed{{{right}}}</answer> but also \\boxed{{{wrong}}}", 2)
    assert (grade.score, grade.details["predicted"], grade.sample_index) == (1.0, right, 2)
    assert AIME25.grade(doc, f"I think it is {right}", 0).score == 0.0  # no box, no answer


def test_avg_at_k_averages_each_problem_first():
    doc_a, doc_b = AIME24.load(shared_data_dir())[:2]
    grades = [AIME24.grade(doc_a, f"\\boxed{{{doc_a['answer']}}}", i) for i in range(4)]
    grades += [AIME24.grade(doc_b, "\\boxed{1000}", 0), AIME24.grade(doc_b, f"\\boxed{{{doc_b['answer']}}}", 1)]
    scores = AIME24.aggregate(grades)
    assert scores["avg_pass_at_1"] == pytest.approx((1.0 + 0.5) / 2)
    assert scores["pass_at_k"] == 1.0 and scores["docs"] == 2 and scores["samples_per_doc"] == 4


@pytest.fixture(scope="module")
def math500() -> dict[str, dict]:
    return {d["id"]: d for d in MATH500.load(shared_data_dir())}


def test_math500_has_500_problems_keyed_by_their_math_path(math500):
    assert len(math500) == 500
    assert all(doc_id.startswith("test/") and doc_id.endswith(".json") for doc_id in math500)
    assert all(doc["problem"] and doc["answer"] for doc in math500.values())
    assert set(math500["test/algebra/2584.json"]) == {"id", "problem", "answer"}
    assert math500["test/algebra/2584.json"]["answer"] == "\\frac{14}{3}"
    assert MATH500.build_prompt(math500["test/algebra/2584.json"], 0).messages == [{"role": "user", "content": math500["test/algebra/2584.json"]["problem"]}]


@pytest.mark.parametrize(
    ("doc_id", "gold", "equivalent", "wrong"),
    [
        ("test/algebra/2584.json", "\\frac{14}{3}", "4\\frac{2}{3}", "\\frac{13}{3}"),
        ("test/precalculus/807.json", "\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{3} \\right)"),
        ("test/intermediate_algebra/558.json", "(3,4]", "(3, 4]", "[3,4]"),  # an interval: its brackets matter
        ("test/precalculus/695.json", "(-\\infty, 0]", "(-\\infty,0]", "(-\\infty, 0)"),
        ("test/algebra/2486.json", "\\left(\\frac{3}{5},\\frac{8}{3}\\right]", "(0.6, \\frac{8}{3}]", "\\left(\\frac{3}{5},\\frac{8}{3}\\right)"),
        ("test/algebra/2036.json", "3\\sqrt{13}", "\\sqrt{117}", "3\\sqrt{12}"),
        ("test/intermediate_algebra/428.json", "3, 5, 7", "3,5,7", "3, 5"),
        ("test/precalculus/927.json", "90^\\circ", "90", "45^\\circ"),
    ],
)
def test_math500_grader_on_real_answers(math500, doc_id, gold, equivalent, wrong):
    doc = math500[doc_id]
    assert doc["answer"] == gold
    assert MATH500.grade(doc, f"<answer>\\boxed{{{gold}}}</answer>", 0).score == 1.0
    assert MATH500.grade(doc, f"<answer>\\boxed{{{equivalent}}}</answer>", 0).score == 1.0
    graded = MATH500.grade(doc, f"<answer>\\boxed{{{wrong}}}</answer>", 1)
    assert (graded.score, graded.details["gold"], graded.sample_index) == (0.0, gold, 1)
