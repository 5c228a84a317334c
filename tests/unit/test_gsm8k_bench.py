"""gsm8k_bench's statistics and its sorting of misses, on hand-made samples."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from gsm8k_bench import answer_record, arm_label, counts_a_name_up, ends_in_repetition, failure_kind, has_escape_slip, paired_bootstrap, paired_differences, parse_arm, wilson  # noqa: E402

from rstar.server.tool_calls import decode_tool_call  # noqa: E402


def sample(score: float, cells: list[dict], gold: str = "18") -> SimpleNamespace:
    message = {"content": "", "code_cells": cells}
    return SimpleNamespace(score=score, grade={"gold": gold}, trajectory={"response": {"choices": [{"message": message}]}})


def test_wilson_bounds_a_zero_score_above_zero_and_holds_the_rate():
    low, high = wilson(0, 300)
    assert low == 0.0 and 0.01 < high < 0.015  # 0 of 300 still allows about 1.3%
    low, high = wilson(30, 1319)
    assert low < 30 / 1319 < high and high - low < 0.02


def test_a_second_delta_is_paired_with_the_first_and_each_tool_user_with_the_base():
    base = {"arm": "base", "template": "native", "scores": {"0": 0.0, "1": 0.0}}
    first = {"arm": "default", "template": "rstar", "scores": {"0": 1.0, "1": 0.0, "2": 0.0}}
    second = {"arm": "default repetition_penalty=1.1", "template": "rstar", "scores": {"0": 1.0, "1": 1.0, "2": 1.0}}
    pairs = paired_differences([base, first, second])
    assert [(p["better"], p["than"], p["problems"]) for p in pairs] == [
        ("default", "base", 2), ("default repetition_penalty=1.1", "base", 2), ("default repetition_penalty=1.1", "default", 3)]
    assert [p["difference"] for p in pairs] == [0.5, 1.0, 2 / 3]  # on the problems both answered


def test_an_arm_names_its_model_template_limit_and_penalties():
    assert parse_arm("default", 700) == {"arm": "default", "model": "default", "template": "rstar", "limit": 700, "penalties": {}}
    base = parse_arm("smollm2-135m-instruct:native:300", 700)
    assert (base["template"], base["limit"]) == ("native", 300)
    penalised = parse_arm("default:rstar::repetition_penalty=1.1:frequency_penalty=0.5")
    assert penalised["arm"] == "default repetition_penalty=1.1 frequency_penalty=0.5" and penalised["limit"] is None
    assert penalised["penalties"] == {"repetition_penalty": 1.1, "frequency_penalty": 0.5}
    with pytest.raises(SystemExit, match="'top_k' is not one of frequency_penalty, repetition_penalty"):
        parse_arm("default:rstar::top_k=3")


def test_the_paired_interval_holds_the_mean_and_excludes_zero_only_when_the_data_do():
    assert paired_bootstrap([0.0] * 100) == (0.0, 0.0)
    low, high = paired_bootstrap([1.0] * 6 + [0.0] * 294)
    assert 0 < low < 6 / 300 < high
    low, high = paired_bootstrap([1.0, -1.0] * 50)
    assert low < 0 < high


@pytest.mark.parametrize("cells, kind", [
    ([], "no call"),
    ([{"status": "invalid_input", "code": "x = ("}], "no call"),
    ([{"status": "error", "stdout": ""}], "failing cell"),
    ([{"status": "ok", "stdout": "180\n"}], "wrong program"),
    ([{"status": "error", "stdout": ""}, {"status": "ok", "stdout": "18.0\n"}], "right program, wrong answer"),
])
def test_a_miss_is_sorted_by_what_its_cells_did(cells, kind):
    assert failure_kind(sample(0.0, cells)) == kind


def test_a_right_answer_is_no_miss():
    assert failure_kind(sample(1.0, [{"status": "ok", "stdout": "18\n"}])) is None


def test_an_answer_record_counts_its_cells_as_tool_use_bench_counts_them():
    # The shape rl_recipe_bench pairs across checkpoints: one record per test problem, keyed by its doc_id.
    record = answer_record(SimpleNamespace(doc_id="17", score=1.0, num_tool_calls=2, grade={"gold": "18"}, trajectory={"response": {
        "choices": [{"message": {"code_cells": [{"status": "error"}, {"status": "ok", "stdout": "18\n"}]}}]}}))
    assert record == {"id": "17", "family": "gsm8k", "accurate": True, "tool_call": True, "cells": 2, "cell_errors": 1}
    missed = answer_record(SimpleNamespace(doc_id="3", score=0.0, num_tool_calls=0, grade={}, trajectory=None))
    assert missed["accurate"] is False and missed["tool_call"] is False and missed["cells"] == 0


def slipped_cell(code_json: str) -> dict:
    """The cell a call with this `code` value (JSON text, as the model wrote it) shows: decoded by the real parser."""
    call = decode_tool_call(0, '{"name": "python_code_with_standard_io", "arguments": {"code": "%s"}}' % code_json)
    if call.decode_error:
        return {"status": "invalid_input", "code": call.raw, "stderr": f"Failed to decode tool call: {call.decode_error}"}
    return {"status": "error", "code": call.code, "stdout": ""}


@pytest.mark.parametrize("code_json, slipped", [
    ("bolts_2 = 2 * 2\\bolts_1 = bolts_2 / 2", True),  # \b: backspace + "olts_1"
    ("x = 1\\fish = 2", True),  # \f: form feed + "ish"
    ("x = 1\\cats = 2", True),  # \c: no such JSON escape, the call does not decode
    ("bolts_2 = 2 * 2\\nbolts_1 = bolts_2 / 2", False),
    ("print('a\\\\bc')", False),  # an escaped backslash is the program's own
])
def test_the_escape_slip_is_told_from_a_program_s_own_backslashes(code_json, slipped):
    assert has_escape_slip(sample(0.0, [slipped_cell(code_json)])) is slipped


def answer_ending(text: str) -> SimpleNamespace:
    """An answer whose text is `text` and in which no cell ran."""
    answer = sample(0.0, [])
    answer.trajectory["response"]["choices"][0]["message"]["content"] = text
    return answer


def test_an_answer_that_counts_one_name_up_is_told_from_a_program_that_numbers_a_few():
    loop = "\n".join(f"eggs_{n} = eggs_{n - 1} + 2" for n in range(2, 40))
    assert counts_a_name_up(sample(0.0, [{"code": loop, "status": "ok", "stdout": ""}]))
    assert counts_a_name_up(answer_ending(loop))  # the loop in the text, no cell ran
    few = "pounds = 6\npounds_2 = pounds + 2\npounds_3 = pounds_2 * 2\nprint(pounds_3)"
    assert not counts_a_name_up(sample(1.0, [{"code": few, "status": "ok", "stdout": "16"}]))
    spread = "\n".join(f"{name}_{n} = 1" for name in ("a", "b") for n in range(2, 6))  # 4 numbers each, two stems
    assert not counts_a_name_up(sample(0.0, [{"code": spread, "status": "ok", "stdout": ""}]))


def test_an_answer_that_ends_writing_one_stretch_again_is_told_from_one_that_repeats_and_moves_on():
    opening = "I will name each step.\n<tool_call>{\"name\": \"python\", \"arguments\": {\"code\": \"trees = 3\\n"
    assert ends_in_repetition(answer_ending(opening + "years_" * 200 + "yea"))  # cut off inside the stretch
    block = "years_a_champ = 20 * 20\\nyears_a_champ_a_champ = 20 * 20\\n"
    assert ends_in_repetition(answer_ending(opening + block * 12))
    assert not ends_in_repetition(answer_ending(opening + block * 3))  # three times is a program, not a loop
    moved_on = opening + block * 6 + "print(trees)\"}}</tool_call>\nThe result is 3, so the answer is \\boxed{3}."
    assert not ends_in_repetition(answer_ending(moved_on))
    assert not ends_in_repetition(answer_ending("The answer is \\boxed{1000000000000}."))  # a long number is no loop


def test_a_plot_label_names_the_model_its_penalties_its_template_and_how_many_problems():
    arm = {"model": "/runs/v6", "penalties": {"frequency_penalty": 0.1, "repetition_penalty": 1.1}, "template": "rstar", "problems": 300}
    assert arm_label(arm) == "v6\nfreq. pen. 0.1\nrep. pen. 1.1\n(rstar, 300)"
    assert arm_label({**arm, "model": "default", "penalties": {}, "template": "native"}) == "default\n(native, 300)"
    served = {**arm, "model": "default", "penalties": {"repetition_penalty": 1.1}, "model_sampling_defaults": {"frequency_penalty": 0.1, "repetition_penalty": 1.2}}
    assert arm_label(served) == "default\nrep. pen. 1.1\nfreq. pen. 0.1 (served)\n(rstar, 300)"  # the arm's own value wins
