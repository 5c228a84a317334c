"""tool_use_bench's arms (a model with and without a penalty) and their pairing, on hand-made answers."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from tool_use_bench import paired, parse_entry  # noqa: E402


def test_an_entry_names_its_model_and_the_penalties_it_sends():
    assert parse_entry(" default ") == ("default", "default", {})
    assert parse_entry("default:frequency_penalty=0") == ("default", "default frequency_penalty=0", {"frequency_penalty": 0.0})
    assert parse_entry("/runs/v6:repetition_penalty=1.1")[2] == {"repetition_penalty": 1.1}
    with pytest.raises(SystemExit, match="tool_use_bench: --models 'default:top_k=3': 'top_k' is not one of"):
        parse_entry("default:top_k=3")


def answers(tool_calls: str, accurate: str) -> list[dict]:
    return [{"id": str(i), "tool_call": t == "1", "accurate": a == "1"} for i, (t, a) in enumerate(zip(tool_calls, accurate))]


def test_each_later_arm_of_a_model_is_paired_with_its_first_on_the_same_problems():
    results = [
        {"model": "default", "arm": "default", "answers": answers("1100", "1000")},
        {"model": "base", "arm": "base", "answers": answers("0000", "0000")},
        {"model": "default", "arm": "default frequency_penalty=0", "answers": list(reversed(answers("1111", "1100")))},
    ]
    (pair,) = paired(results)  # the base has no second arm; it is never paired with another model
    assert (pair["better"], pair["than"], pair["problems"]) == ("default frequency_penalty=0", "default", 4)
    assert pair["tool_call"]["difference"] == 0.5 and pair["accurate"]["difference"] == 0.25  # matched by id, not order
    low, high = pair["tool_call"]["difference_95"]
    assert 0.0 <= low <= 0.5 <= high <= 1.0
