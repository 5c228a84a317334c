"""GSM8K solutions as programs (rl/sft/gsm8k.py), on the real training rows: each program prints the gold
answer, names its steps after what they count, and a row no program can be written for is refused by index."""

from __future__ import annotations

import contextlib
import io
import re
from collections import Counter
from fractions import Fraction

import pytest
from evals_data import shared_data_dir

from rstar.evals.data import read_jsonl
from rstar.evals.gsm8k import gold_answer
from rstar.rl.sft.data import plan_gsm8k
from rstar.rl.sft.gsm8k import NO_ANSWER_STEP, NO_CALCULATION, REFUSALS, WRONG_RESULT, NotConvertible, solution_program


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return list(read_jsonl(shared_data_dir() / "gsm8k" / "train.jsonl"))


def program(row: dict):
    return solution_program(row["idx"], row["question"], row["answer"], gold_answer(row["answer"]))


def converted_codes(rows: list[dict]) -> list[tuple[dict, str]]:
    """Each row that becomes a program, with the program's code; refused rows left out."""
    codes = []
    for row in rows:
        try:
            codes.append((row, program(row).code))
        except NotConvertible:
            continue
    return codes


def printed(code: str) -> str:
    """What a generated program prints: plain arithmetic, so it runs here (the SFT builder runs it in the sandbox)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<gsm8k program>", "exec"), {"__builtins__": {"print": print}})
    return out.getvalue().strip()


def test_the_first_row_becomes_a_program_that_names_its_steps(rows):
    assert program(rows[0]).code == "clips_in_may = 48 / 2\nclips_in_april = 48 + clips_in_may\nprint(clips_in_april)"
    # Later steps use earlier results by name, not the numbers the solution copied: the program reads as the reasoning.
    julie = program(rows[3]).code.splitlines()
    assert julie[1] == "pages_since_yesterday = 12 + pages_today" and julie[-1] == "print(pages)"


def test_every_converted_row_of_the_first_thousand_prints_its_gold_answer(rows):
    converted = converted_codes(rows[:1000])
    for row, code in converted:
        assert Fraction(printed(code)) == Fraction(gold_answer(row["answer"])), (row["idx"], code)
        assert len(set(line.partition(" = ")[0] for line in code.splitlines()[:-1])) == len(code.splitlines()) - 1  # unique names
    assert len(converted) >= 950


def test_a_taken_name_is_told_apart_by_the_words_before_it_not_by_a_number(rows):
    # Row 7 weighs the box three times, each step ending in "pounds": the nearer words before each step name it.
    names = [line.partition(" = ")[0] for line in program(rows[7]).code.splitlines()[:-1]]
    assert names[-3:] == ["pounds", "weight_pounds", "final_weight_pounds"], names
    numbered = sum(any(re.search(r"_\d+ = ", line) for line in code.splitlines()) for _, code in converted_codes(rows[:1000]))
    assert numbered <= 50  # 40 when written; 395 when a taken name was numbered at once


def test_rows_without_a_program_are_refused_naming_their_index(rows):
    with pytest.raises(NotConvertible, match="row 29: the solution writes no calculation down") as no_calculation:
        program(rows[29])
    assert no_calculation.value.reason == NO_CALCULATION and no_calculation.value.index == 29
    with pytest.raises(NotConvertible, match="row 32: no written step gives the gold answer") as no_answer:
        program(rows[32])
    assert no_answer.value.reason == NO_ANSWER_STEP
    wrong = {**rows[0], "answer": rows[0]["answer"].replace("<<48/2=24>>", "<<48/2=25>>")}
    with pytest.raises(NotConvertible, match=r"row 0: an annotation's expression does not give the result it states: <<48/2=25>> gives 24") as error:
        program(wrong)
    assert error.value.reason == WRONG_RESULT


@pytest.mark.parametrize(
    ("annotation", "value"),
    [("<<2*20*.01=.4>>", Fraction(2, 5)), ("<<100-05=95>>", 95), ("<<1/3=0.33>>", Fraction(1, 3)), ("<<2^3=8>>", 8)],
)
def test_calculator_notation_computes_as_the_solution_meant(annotation, value):
    # Leading dots and zeros, a result rounded to the digits it states, ^ for a power.
    solution = f"It is {annotation} here.\n#### {value}"
    assert solution_program(7, "A question.", solution, str(value)).steps[0].value == value


def test_a_written_out_final_step_counts_when_it_is_arithmetic(rows):
    # Row 23 ends "She bought 4 tops for a total of $20 so 20/4 = $5" with no annotation: that step gives the answer.
    code = program(rows[23]).code.splitlines()
    assert code[-3:] == ["cost_left_difference = 75 - shorts_shoes_cost", "bought_tops = cost_left_difference / 4", "print(bought_tops)"]
    assert printed("\n".join(code)) == "5.0"


def test_the_whole_training_split_survives_as_measured(rows):
    plan = plan_gsm8k(rows, seed=0, count=100)
    assert len(plan.sft) == 100 and len(plan.sft) + len(plan.rl) + len(plan.refused) == len(rows) == 7473
    assert {e.id for e in plan.sft}.isdisjoint(e.id for e in plan.rl)
    reasons = Counter(exc.reason for exc in plan.refused)
    assert set(reasons) <= set(REFUSALS) and len(plan.refused) <= 300, reasons  # 275 when written: 86 + 189
    assert [e.id for e in plan_gsm8k(rows, seed=0, count=100).sft] == [e.id for e in plan.sft]
    assert [e.id for e in plan_gsm8k(rows, seed=1, count=100).sft] != [e.id for e in plan.sft]


@pytest.mark.parametrize(
    ("output", "answer", "same"),
    [("72", "72", True), ("72.0", "72", True), ("71.99999999999999", "72", True), ("72.5", "72", False),
     ("1000000000001", "1000000000000", False), ("10.000000000000002", "10", True), ("-3.0", "-3", True), ("x", "72", False)],
)
def test_a_program_prints_the_answer_as_a_number(output, answer, same):
    from rstar.rl.sft.data import prints_answer

    assert prints_answer(output, answer) is same


def test_make_sft_data_refuses_a_missing_file_and_the_test_split(tmp_path):
    from typer.testing import CliRunner

    from rstar.rl.cli import app

    missing = CliRunner().invoke(app, ["make-sft-data", "--out", str(tmp_path / "out"), "--gsm8k", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "--gsm8k: no file at" in missing.output
    test_split = CliRunner().invoke(app, ["make-sft-data", "--out", str(tmp_path / "out"), "--gsm8k", str(shared_data_dir() / "gsm8k" / "test.jsonl")])
    assert test_split.exit_code == 2 and "looks like the test split" in test_split.output
    assert not (tmp_path / "out").exists()  # refused before anything is written
