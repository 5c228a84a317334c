"""The router benchmarks' shared workload (skewed multi-turn RL step) and per-policy report."""

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from router_workload import WorkloadShape, describe, goals, make_workload, percentile, split, summarize  # noqa: E402

SHAPE = WorkloadShape(prompts=64, rollouts=32)


def test_the_workload_is_deterministic_in_its_seed():
    assert make_workload(SHAPE, 7) == make_workload(SHAPE, 7)
    assert make_workload(SHAPE, 7) != make_workload(SHAPE, 8)


def test_the_workload_respects_the_papers_limits():
    specs = make_workload(SHAPE, 0)
    assert len(specs) == 64 * 32 and [spec.uid for spec in specs] == list(range(len(specs)))
    for spec in specs:
        assert 1 <= len(spec.turns) <= SHAPE.max_turns
        assert spec.response_tokens <= SHAPE.max_response_tokens
        assert all(turn.generated >= 1 for turn in spec.turns)
        assert spec.turns[-1].tool_response == 0 and all(turn.tool_response > 0 for turn in spec.turns[:-1])
    groups = {}
    for spec in specs:
        groups.setdefault(spec.group, set()).add(spec.problem_tokens)
    assert all(len(sizes) == 1 for sizes in groups.values())  # a group shares its prompt


def test_the_workload_is_skewed_many_short_a_long_tail_and_long_ones_call_more_tools():
    specs = make_workload(SHAPE, 0)
    figures = describe(specs)
    assert figures["response_tokens_p50"] < 0.75 * figures["response_tokens_mean"] < figures["response_tokens_p95"] / 2
    assert 1.8 < figures["tool_calls_mean"] <= SHAPE.mean_tool_calls  # the 8K cap trims the tail's calls a little
    short = [s.tool_calls for s in specs if s.response_tokens < 1000]
    long = [s.tool_calls for s in specs if s.response_tokens > 4000]
    assert statistics.fmean(long) > 3 * statistics.fmean(short)


@pytest.mark.parametrize("total,parts", [(10, 1), (10, 10), (1000, 7)])
def test_split_gives_positive_parts_that_add_up(total, parts):
    import random

    sizes = split(random.Random(0), total, parts)
    assert len(sizes) == parts and sum(sizes) == total and min(sizes) >= 1


def test_percentile_is_nearest_rank():
    values = [5, 1, 4, 2, 3, 10, 9, 8, 7, 6]
    assert percentile(values, 50) == 5
    assert percentile(values, 95) == 10
    assert percentile(values, 10) == 1
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_and_goals():
    kv = summarize([1.0, 2.0, 3.0, 4.0], generated_tokens=800, wall_s=4.0)
    lr = summarize([1.0, 2.0, 3.0, 5.0], generated_tokens=840, wall_s=4.0)
    assert kv["latency_p95_s"] == 4.0 and kv["throughput_tok_s"] == 200.0
    ratio, throughput = goals({"kv_aware": kv, "least_requests": lr, "round_robin": lr})
    assert ratio["value"] == 0.8 and ratio["op"] == "<=" and ratio["target"] == 0.8
    assert throughput["value"] == pytest.approx(800 / 840, abs=1e-4) and throughput["op"] == ">="
