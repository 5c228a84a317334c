"""The router simulator's core: its cost model, its engine (batching, prefix cache, preemption) and golden
routing cases, with the real `Router` deciding."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from router_sim import CostModel, gpu_cost_model, simulate  # noqa: E402
from router_workload import TrajectorySpec, Turn, WorkloadShape, make_workload  # noqa: E402

POLICIES = ("kv_aware", "least_requests", "round_robin")

# Round numbers so that golden times can be worked out by hand.
COST = CostModel(
    name="test",
    decode_step_base_s=0.01,
    decode_step_per_seq_s=0.001,
    decode_step_per_context_token_s=0.0,
    prefill_per_token_s=0.0001,
    kv_capacity_tokens=16 * 1000,
    max_num_seqs=64,
    tool_latency_mean_s=0.3,
    tool_latency_sigma=0.5,
)


def one(uid, problem_tokens, *turns, group=None):
    return TrajectorySpec(uid=uid, group=uid if group is None else group, problem_tokens=problem_tokens, turns=tuple(Turn(*turn) for turn in turns))


SMALL = WorkloadShape(prompts=6, rollouts=4, mean_response_tokens=300, max_response_tokens=1200, max_turns=4)


def small_workload(seed=0):
    return make_workload(SMALL, seed)


def test_chunk_time_adds_up_steps_whose_context_grows():
    cost = replace(COST, decode_step_per_context_token_s=1e-6)
    # 3 steps of 2 sequences from 100 context tokens: each step 0.01 + 0.002 + 1e-6 * (100, 102, 104)
    assert cost.chunk_s(3, 2, 100) == pytest.approx(3 * 0.012 + 1e-6 * 306)
    for steps in (1, 2, 7, 40):
        end = cost.chunk_s(steps, 2, 100)
        assert cost.steps_under_way(end, 2, 100) == steps
        assert cost.steps_under_way(end + 1e-9, 2, 100) == steps + 1
    assert cost.steps_under_way(-1.0, 2, 100) == 1  # the first step is under way from the start


def test_a_single_turn_takes_prefill_plus_its_decode_steps():
    # 160 prompt tokens (no system prompt), 10 tokens: one step with the prefill, 10 steps of one sequence
    result = simulate([one(0, 160, (10, 0))], 1, "kv_aware", COST, system_tokens=0)
    assert result.makespan_s == pytest.approx(160 * 0.0001 + 10 * 0.011)
    assert result.prefill_tokens == 160 and result.cached_prompt_tokens == 0
    assert result.idle_fraction == pytest.approx(0.0)


def test_the_next_turn_reuses_the_blocks_its_replica_cached_during_the_tool_call():
    # turn 1: 160-token prompt, 40 sampled -> 200 tokens, 12 full blocks cached; a 24-token tool result -> a
    # 224-token prompt whose first 12 blocks (192 tokens) are cached: 32 to prefill
    result = simulate([one(0, 160, (40, 24), (8, 0))], 1, "kv_aware", COST, system_tokens=0)
    assert result.cached_prompt_tokens == 192
    assert result.prefill_tokens == 160 + 32


@pytest.mark.parametrize("seed", [0, 1])
def test_with_one_replica_every_policy_gives_the_same_step(seed):
    specs = small_workload(seed)
    roomy = replace(COST, kv_capacity_tokens=16 * 100_000)  # holds every turn's whole budget: no KV-aware gating
    results = [simulate(specs, 1, policy, roomy, system_tokens=64, seed=seed, max_response_tokens=SMALL.max_response_tokens) for policy in POLICIES]
    assert len({round(r.makespan_s, 9) for r in results}) == 1
    assert results[0].latencies_s == results[1].latencies_s == results[2].latencies_s


@pytest.mark.parametrize("policy", POLICIES)
def test_every_trajectory_finishes_and_exactly_the_requested_tokens_are_generated_even_with_preemptions(policy):
    specs = small_workload()
    tight = replace(COST, kv_capacity_tokens=16 * 100)  # 1,600 tokens: the longest context (1,402) fits alone
    result = simulate(specs, 2, policy, tight, system_tokens=64, max_response_tokens=SMALL.max_response_tokens)
    # the preemption path is exercised; the KV-aware router, counting each turn's budget, keeps clear of it here
    assert result.preemptions == 0 if policy == "kv_aware" else result.preemptions > 0
    assert len(result.latencies_s) == len(specs) and all(latency > 0 for latency in result.latencies_s)
    assert result.generated_tokens == result.requested_tokens == sum(spec.generated_tokens for spec in specs)


def test_idle_fraction_counts_a_replica_with_nothing_to_do():
    result = simulate([one(0, 160, (50, 0))], 2, "round_robin", COST, system_tokens=0)
    assert result.idle_fraction == pytest.approx(0.5)


def test_tool_calls_leave_the_engine_idle_and_follow_the_latency_distribution():
    turns = [(16, 20)] * 40 + [(16, 0)]
    result = simulate([one(0, 160, *turns)], 1, "kv_aware", COST, system_tokens=0, seed=3)
    busy_s = 41 * 16 * 0.011 + result.prefill_tokens * 0.0001  # one sequence decoding, and its prefills
    assert (1 - result.idle_fraction) * result.makespan_s == pytest.approx(busy_s)
    tools_s = result.makespan_s - busy_s  # the engine idles while each of the 40 calls (mean 0.3 s) runs
    assert 40 * 0.3 * 0.8 < tools_s < 40 * 0.3 * 1.2


def test_kv_aware_avoids_the_overload_least_requests_walks_into():
    """Replica 0 gets one huge trajectory first; least-requests then sends the next big prompt there because
    it has fewer requests, and the two outgrow its KV cache; KV-aware sends it to the replica with room."""
    cost = replace(COST, kv_capacity_tokens=8000)
    specs = [
        one(0, 4000, (3000, 0)),  # to replica 0 under both policies (tie -> lowest index)
        one(1, 100, (50, 0)),  # replica 1
        one(2, 100, (50, 0)),  # least_requests: replica 0 (1 vs 1 in flight); kv_aware: replica 1 (more room)
        one(3, 100, (50, 0)),
        one(4, 2000, (2000, 0)),  # least_requests: replica 0 again; 4000+3000 and 2000+2000 do not fit 8000
    ]
    least = simulate(specs, 2, "least_requests", cost, system_tokens=0)
    aware = simulate(specs, 2, "kv_aware", cost, system_tokens=0)
    assert least.preemptions > 0
    assert aware.preemptions == 0
    assert aware.makespan_s < least.makespan_s


def test_group_rollouts_spread_by_free_room_like_round_robin_and_reuse_the_prompt_where_two_land():
    # A group's samples share their prompt but continue nothing: the KV-aware router balances them (a second
    # prefill of 320 tokens costs far less than an idle replica), and on each replica the prompt is prefilled once.
    specs = [one(i, 320, (20, 0), group=0) for i in range(8)]
    aware = simulate(specs, 4, "kv_aware", COST, system_tokens=0, max_response_tokens=20)
    spread = simulate(specs, 4, "round_robin", COST, system_tokens=0, max_response_tokens=20)
    assert aware.prefill_tokens == spread.prefill_tokens == 4 * 320
    assert aware.makespan_s == pytest.approx(spread.makespan_s)
    assert aware.idle_fraction == pytest.approx(spread.idle_fraction)


def test_the_assumed_gpu_model_states_its_basis_and_is_in_a_plausible_range():
    gpu = gpu_cost_model()
    assert "assumption" in gpu.basis["kind"]
    assert 0.005 < gpu.decode_step_base_s < 0.05  # a 14B decode step on one accelerator: milliseconds
    assert 100_000 < gpu.kv_capacity_tokens < 2_000_000
    assert gpu.tool_latency_mean_s == 0.3
