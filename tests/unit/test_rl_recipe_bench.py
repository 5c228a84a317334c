"""rl_recipe_bench's held-out set (shapes no training data uses) and its statistics, on hand-made answers."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from heldout_shapes import BENCH_SHAPES, heldout_set, shapes  # noqa: E402
from rl_recipe_bench import answers_matrix, bootstrap, interval, last_steps_mean, summarize  # noqa: E402

from rstar.rl.sft.catalogue import FAMILIES, heldout_phrasing_ids  # noqa: E402
from rstar.rl.sft.data import generate_problems  # noqa: E402


def test_the_new_shapes_are_in_no_training_phrasing_and_the_set_spreads_over_all_of_them():
    training = {phrasing.text for family in FAMILIES for phrasing in family.phrasings}
    new = [phrasing.text for phrasings in BENCH_SHAPES.values() for phrasing in phrasings]
    assert not training & set(new) and len(set(new)) == len(new)
    assert len(shapes()) == len(heldout_phrasing_ids()) + len(new) >= 30
    rows = heldout_set(518)
    per_shape = {}
    for row in rows:
        per_shape[row["phrasing"]] = per_shape.get(row["phrasing"], 0) + 1
    assert set(per_shape.values()) == {14} and len({row["problem"] for row in rows}) == 518
    # None of the RL training problems of `rstar rl make-sft-data` (seed 0) is among them.
    assert not {row["problem"] for row in rows} & {e.problem for e in generate_problems(0, 1000, "train", stream="rl")}


def test_held_out_answers_are_computed_and_the_same_seed_gives_the_same_set():
    rows = {row["problem"]: row["answer"] for row in heldout_set(74)}
    assert rows["Give the product 72,295 × 33,966."] == str(72_295 * 33_966)
    assert heldout_set(74) == heldout_set(74) != heldout_set(74, seed=1)


def test_the_bootstrap_holds_the_mean_and_its_interval_narrows_with_more_problems():
    rng = np.random.default_rng(1)
    constant = np.ones((3, 50))
    assert bootstrap(constant, np.arange(50), rng) == (1.0, 1.0, 1.0)
    small = rng.random((3, 40)) < 0.5
    large = rng.random((3, 1000)) < 0.5
    mean, low, high = bootstrap(small.astype(float), np.arange(40), rng)
    _, large_low, large_high = bootstrap(large.astype(float), np.arange(1000), rng)
    assert low < mean < high and large_high - large_low < (high - low) / 3


def test_an_interval_over_shapes_is_wider_when_shapes_pass_or_fail_whole():
    # 20 shapes of 10 problems, each shape all right or all wrong: 200 problems, but 20 independent results.
    matrix = np.repeat((np.arange(20) % 2).astype(float), 10)[None, :].repeat(3, axis=0)
    labels = np.repeat(np.arange(20), 10)
    rng = np.random.default_rng(0)
    _, low, high = bootstrap(matrix, np.arange(200), rng)
    _, shape_low, shape_high = bootstrap(matrix, labels, rng)
    assert shape_high - shape_low > 2 * (high - low)


def evaluation(correct: list[bool], ids=None) -> dict:
    ids = range(len(correct)) if ids is None else ids
    return {"answers": [{"id": i, "accurate": c, "tool_call": True, "cells": 1, "cell_errors": int(not c), "family": "word"}
                        for i, c in zip(ids, correct)]}


def test_the_difference_to_the_control_is_paired_problem_by_problem():
    problems = [{"phrasing": f"s/{i % 5}", "family": "word"} for i in range(100)]
    control = [{"seed": "start model", "steps": [], "train_s": 0.0, "heldout": evaluation([i < 50 for i in range(100)])}]
    # Each seed gets the control's 50 right plus 10 more: +10 points on every seed, no problem lost.
    runs = [{"seed": s, "steps": [{"tool_error_rate_positive": 0.2 - 0.01 * s}, {"tool_error_rate_positive": 0.1}],
             "train_s": 60.0, "heldout": evaluation([i < 60 for i in range(100)])} for s in range(3)]
    summary = summarize("roc", runs, control, problems)
    assert summary["accuracy"]["mean"] == 60.0 and summary["difference_to_control"]["mean"] == 10.0
    assert summary["difference_to_control"]["ci95"][0] > 0
    assert summary["cell_error_rate"] == 40.0
    assert abs(summary["tool_error_rate_positive_last_steps"] - (0.2 + 0.19 + 0.18 + 0.3) / 6) < 1e-9


def test_the_last_steps_mean_skips_steps_with_no_positive_rollout():
    assert last_steps_mean([0.5, None, 0.25]) == 0.25
    assert last_steps_mean([None, None]) is None


def test_evaluations_of_different_problems_are_not_paired():
    with pytest.raises(ValueError, match="different problems"):
        answers_matrix([evaluation([True, False]), evaluation([True, False], ids=[1, 0])], "accurate")


def test_problems_without_shapes_get_no_interval_over_shapes():
    # GSM8K's test problems have no sentence shapes: the interval is over seeds and problems only.
    matrix = (np.arange(40) % 2).astype(float)[None, :]
    assert interval(matrix, [{"id": i, "family": "gsm8k"} for i in range(40)])["ci95_over_shapes"] is None
    assert interval(matrix, [{"id": i, "phrasing": i % 4} for i in range(40)])["ci95_over_shapes"] is not None
