"""Routing policies as pure decisions: golden cases for sticky, KV-aware, overload and replica loss."""

import pytest

from rstar.server.routing import NoHealthyReplica, ReplicaState, Router, block_hashes

SYSTEM = list(range(1000, 1064))  # 4 blocks every request shares


def up(in_flight=0, kv_free=10_000):
    return ReplicaState(healthy=True, in_flight=in_flight, kv_free_tokens=kv_free)


DOWN = ReplicaState(healthy=False, in_flight=0, kv_free_tokens=0)


def test_block_hashes_chain_prefixes():
    a = block_hashes(list(range(40)), 16)
    b = block_hashes(list(range(32)) + [7] * 8, 16)
    c = block_hashes([99] + list(range(1, 40)), 16)
    assert len(a) == 2 and a == b  # the partial last block is not a cache block
    assert a[0] != c[0] and a[1] != c[1]  # a different first block changes every later hash


def test_kv_aware_picks_the_most_free_kv_cache():
    router = Router(replicas=3)
    assert router.choose(SYSTEM, [up(kv_free=100), up(kv_free=900), up(kv_free=500)]) == 1


def test_kv_aware_breaks_ties_by_fewer_requests_then_index():
    router = Router(replicas=3)
    assert router.choose(SYSTEM, [up(2, 500), up(1, 500), up(1, 500)]) == 1


def test_a_multi_turn_trajectory_stays_on_its_replica_while_its_next_turn_fits_there():
    router = Router(replicas=2)
    router.remember(0, SYSTEM + [1] * 16)  # other conversations: both replicas hold the shared system prompt
    router.remember(1, SYSTEM + [2] * 16)
    turn_1 = SYSTEM + list(range(64))
    assert router.choose(turn_1, [up(kv_free=100), up(kv_free=900)]) == 1
    router.remember(1, turn_1)
    turn_2 = turn_1 + list(range(500, 548))  # 176 tokens, 128 of them cached on replica 1
    assert router.choose(turn_2, [up(kv_free=900), up(1, kv_free=200)]) == 1  # less room, but it fits there
    assert router.choose(turn_2, [up(kv_free=900), up(1, kv_free=200)], max_tokens=48) == 1  # 200 - 48 - 48 >= 0
    assert router.choose(turn_2, [up(kv_free=900), up(1, kv_free=200)], max_tokens=200) == 0  # no room for its output


def test_kv_aware_queues_a_request_no_busy_replica_has_room_for_and_an_idle_one_always_takes_one():
    router = Router(replicas=2)
    prompt = list(range(100))
    assert router.choose(prompt, [up(1, kv_free=150), up(2, kv_free=199)], max_tokens=100) is None
    assert router.choose(prompt, [up(1, kv_free=150), up(2, kv_free=200)], max_tokens=100) == 1
    assert router.choose(prompt, [up(1, kv_free=150), up(0, kv_free=50)], max_tokens=100) == 1  # larger than its cache
    least = Router(replicas=2, policy="least_requests")
    assert least.choose(prompt, [up(1, kv_free=150), up(2, kv_free=199)], max_tokens=100) == 0  # blind to KV


def test_a_replica_holding_only_the_shared_system_prompt_does_not_draw_every_new_problem():
    router = Router(replicas=2)
    problem_a, problem_b = SYSTEM + list(range(64)), SYSTEM + list(range(300, 364))
    assert router.choose(problem_a, [up(kv_free=10_000), up(kv_free=10_000)]) == 0
    router.remember(0, problem_a)
    # replica 0 spent problem A's 128 tokens and holds the 64 shared ones: 9_936 free after B vs 9_872 on replica 1
    assert router.choose(problem_b, [up(in_flight=1, kv_free=10_000 - 128), up(kv_free=10_000)]) == 1
    assert router.choose(problem_b, [up(in_flight=1, kv_free=10_000 - 32), up(kv_free=10_000)]) == 0


def test_samples_of_one_prompt_are_no_continuation_but_kv_aware_counts_their_shared_prefix():
    group_prompt = SYSTEM + list(range(64))
    least = Router(replicas=2, policy="least_requests")
    least.remember(0, group_prompt)
    assert least.choose(group_prompt, [up(in_flight=1), up(in_flight=0)]) == 1
    kv = Router(replicas=2)
    kv.remember(0, group_prompt)
    assert kv.choose(group_prompt, [up(kv_free=9_900), up(kv_free=10_000)]) == 0  # 128 cached > 100 less free
    assert kv.choose(group_prompt, [up(kv_free=9_800), up(kv_free=10_000)]) == 1


def test_least_requests_sticks_to_the_longest_continued_sequence_when_two_replicas_hold_one():
    router = Router(replicas=2, policy="least_requests")
    turn_1 = SYSTEM + list(range(64))
    turn_2 = turn_1 + list(range(700, 732))
    router.remember(0, turn_1)
    router.remember(1, turn_2)  # the trajectory moved to replica 1 for its second turn
    turn_3 = turn_2 + list(range(800, 832))
    assert router.choose(turn_3, [up(in_flight=0), up(in_flight=5)]) == 1


def test_least_requests_sticks_regardless_of_load_and_otherwise_takes_the_least_busy():
    router = Router(replicas=2, policy="least_requests")
    history = SYSTEM + list(range(64))
    router.remember(0, history)
    assert router.choose(history + [1] * 16, [up(in_flight=9, kv_free=0), up(in_flight=0)]) == 0
    assert router.choose(list(range(2000, 2100)), [up(in_flight=9), up(in_flight=3)]) == 1


def test_round_robin_cycles_over_open_replicas_and_ignores_prefixes():
    router = Router(replicas=3, policy="round_robin", max_in_flight=2)
    router.remember(2, SYSTEM)
    states = [up(), up(in_flight=2), up()]  # replica 1 is full
    assert [router.choose(SYSTEM, states) for _ in range(4)] == [0, 2, 0, 2]


@pytest.mark.parametrize("policy", ["kv_aware", "least_requests", "round_robin"])
def test_when_every_replica_is_full_the_request_waits_at_the_router(policy):
    router = Router(replicas=2, policy=policy, max_in_flight=4)
    assert router.choose(SYSTEM, [up(in_flight=4), up(in_flight=4)]) is None
    assert router.choose(SYSTEM, [up(in_flight=4), up(in_flight=3)]) == 1


@pytest.mark.parametrize("policy", ["kv_aware", "least_requests", "round_robin"])
def test_a_lost_replica_gets_no_traffic_and_none_left_is_an_error(policy):
    router = Router(replicas=2, policy=policy)
    history = SYSTEM + list(range(64))
    router.remember(0, history)
    assert router.choose(history, [DOWN, up()]) == 1
    with pytest.raises(NoHealthyReplica):
        router.choose(history, [DOWN, DOWN])


def test_a_restarted_replica_has_forgotten_its_prefixes():
    router = Router(replicas=2)
    history = SYSTEM + list(range(64))
    router.remember(0, history)
    assert router.cached_blocks(0, block_hashes(history, 16)) == 8
    router.forget(0)
    assert router.cached_blocks(0, block_hashes(history, 16)) == 0
    assert router.choose(history, [up(kv_free=100), up(kv_free=900)]) == 1


def test_a_dispatch_takes_only_its_uncached_tokens_from_a_replicas_room():
    router = Router(replicas=2)
    router.remember(0, SYSTEM)
    prompt = SYSTEM + list(range(40))
    assert router.uncached_tokens(0, prompt) == 40
    assert router.uncached_tokens(1, prompt) == 104


def test_remembered_blocks_are_bounded_least_recently_used_first():
    router = Router(replicas=1, max_blocks=4)
    old, new = list(range(64)), list(range(5000, 5064))
    router.remember(0, old)
    router.remember(0, new)
    assert router.cached_blocks(0, block_hashes(old, 16)) == 0
    assert router.cached_blocks(0, block_hashes(new, 16)) == 4


def test_bad_configuration_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown routing policy 'fastest'"):
        Router(replicas=2, policy="fastest")
    with pytest.raises(ValueError, match="expected 2 replica states"):
        Router(replicas=2).choose(SYSTEM, [up()])
