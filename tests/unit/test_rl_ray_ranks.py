"""Trainer ranks on Ray: rank 1 a Ray actor placed by a placement group (a local Ray of two CPUs) trains the update
the local launcher's spawned rank trains, a killed actor is named, and a cluster too small for the ranks is refused
in one line."""

from __future__ import annotations

import random

import pytest
import ray
import torch

from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.distributed import check_world_size
from rstar.rl.grpo.ranks import RankDied, TrainerRanks
from rstar.rl.grpo.ray_ranks import NoRoomForRanks, RayPlacement
from tests.unit.test_rl_distributed import group, tiny_model_dir, worst  # noqa: F401 - the fixture, and its vocabulary's groups


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    try:
        yield
    finally:
        ray.shutdown()


def test_ranks_placed_by_ray_update_the_weights_the_local_launcher_does(tiny_model_dir, local_ray):
    try:
        check_world_size(2)
    except ValueError as exc:  # one core
        pytest.skip(str(exc))
    rng = random.Random(5)
    trees = [group(rng, 10, [5, 9], [1.0, -1.0]), group(rng, 7, [20, 3, 4], [0.5, -0.5, 1.0]), group(rng, 12, [2, 2], [-1.0, 1.0])]
    config = GRPOConfig(learning_rate=1e-3, warmup_steps=0, compute_dtype="float32", grad_clip=0.05)

    with TrainerRanks(tiny_model_dir, "float32", config, size=2) as ranks:
        local = ranks.update(trees, config)
        local_weights = ranks.full_state_dict()
    with pytest.raises(RankDied, match=r"trainer rank 1 of 2 \(Ray actor, pid \d+\) died \(\w+Error"):
        with TrainerRanks(tiny_model_dir, "float32", config, size=2, placement=RayPlacement()) as ranks:
            assert ray.util.placement_group_table()  # the follower's bundle
            on_ray = ranks.update(trees, config)
            ray_weights = ranks.full_state_dict()
            ray.kill(ranks.followers.actors[0])
            ranks.update(trees, config)
    assert on_ray["loss"] == pytest.approx(local["loss"], abs=1e-5)
    assert on_ray["grad_norm"] == pytest.approx(local["grad_norm"], rel=1e-5)
    assert worst(local_weights, ray_weights) <= 1e-5
    assert all(entry["state"] == "REMOVED" for entry in ray.util.placement_group_table().values())  # released on close
    assert ray.is_initialized()  # the test's Ray: the ranks joined it and left it running


def test_more_ranks_than_the_cluster_holds_is_refused_in_one_line(tiny_model_dir, local_ray):
    config = GRPOConfig(compute_dtype="float32")
    with pytest.raises(NoRoomForRanks, match=r"trainer_ranks 4: ranks 1..3 need one CPU each on the Ray cluster, which has 2 .* use --trainer-ranks 3 or fewer"):
        TrainerRanks(tiny_model_dir, "float32", config, size=4, placement=RayPlacement())
