"""Training problems: the accepted shapes, the shared data files, and rows refused with their line named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstar.rl.data import DataError, load_problems

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def write(tmp_path, rows) -> str:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def test_problem_answer_rows_and_gsm8k_solutions(tmp_path):
    problems = load_problems(write(tmp_path, [
        {"problem": "1+1?", "answer": "2", "id": "a"},
        {"question": "Eggs?", "answer": "16 - 3 = <<16-3=13>>13\n#### 13"},
        {"problem": "x?", "answer": 7},
    ]))
    assert [(p.problem, p.answer) for p in problems] == [("1+1?", "2"), ("Eggs?", "13"), ("x?", "7")]
    assert problems[0].id == "a" and problems[1].id.endswith("problems.jsonl:2")


@pytest.mark.parametrize("row, message", [
    ({"problem": "1+1?"}, ":2: no 'answer'"),
    ({"problem": "1+1?", "answer": ""}, ":2: no 'answer'"),
    ({"answer": "3"}, ":2: no 'problem'"),
    ("{not json", ":2: not valid JSON"),
    ([1, 2], ":2: expected a JSON object"),
])
def test_unusable_rows_are_refused_naming_the_line(tmp_path, row, message):
    with pytest.raises(DataError, match=message):
        load_problems(write(tmp_path, [{"problem": "ok", "answer": "1"}, row]))


def test_missing_source_and_empty_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_problems(str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no problems"):
        load_problems(str(tmp_path / "empty.jsonl"))


@pytest.mark.parametrize("name, count", [("gsm8k/train.jsonl", 7473), ("math500/test.jsonl", 500)])
def test_the_shared_training_sets_load(name, count):
    problems = load_problems(str(SHARED / name))
    assert len(problems) == count
    assert all(p.answer for p in problems)
    if name.startswith("gsm8k"):
        assert problems[0].answer == "72"  # "#### 72" of Natalia's clips


def test_math_train_is_refused_at_its_first_unanswered_row():
    # Two MATH train solutions end in an empty \boxed{} (shared/data/math_train/SOURCE.md): no reward possible.
    with pytest.raises(DataError, match=r"math_train/train.jsonl:5530: no 'answer'"):
        load_problems(str(SHARED / "math_train/train.jsonl"))
