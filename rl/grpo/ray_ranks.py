"""Trainer ranks 1..N-1 as Ray actors, placed on the cluster by a placement group.

Rank 0 stays in the process that owns the engine (`ranks.py`), so it is not in the group: the group has one bundle
for each other rank, {"GPU": 1} when the ranks train on GPUs and {"CPU": 1} on CPU, with the PACK strategy: FSDP
all-gathers every layer's weights and reduce-scatters its gradients, so ranks on one node (its fast links) beat
ranks spread out, and PACK spills to more nodes only when one cannot hold them all. Each actor runs the very rank
function the local launcher spawns (`ranks.follow`), joining rank 0 at this node's address (MASTER_ADDR) and a
free port (MASTER_PORT) as rank r of N (RANK, WORLD_SIZE).

What the ranks read and write must be at the same path on every node: the model directory, and the checkpoint
directory each rank writes its shards into (a shared filesystem, as verl's and TRL's multi-node runs assume).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rstar import ray_cluster
from rstar.rl.grpo.ranks import follow

# Placement waits this long for the cluster to find room before the run is refused (a busy cluster may free it).
PLACEMENT_TIMEOUT_S = 120.0


class NoRoomForRanks(ValueError):
    """The Ray cluster cannot place the trainer's ranks; the message names what is missing and the fix."""


@dataclass(frozen=True)
class RayPlacement:
    """Run ranks 1..N-1 on Ray: the cluster at `address` ('auto', 'ray://host:10001'), or None for a local Ray
    started here (or the one this process is already connected to)."""

    address: str | None = None


class TrainerRankActor:
    """One trainer rank in a Ray actor."""

    def pid(self) -> int:
        return os.getpid()

    def follow(self, rank: int, *args) -> None:
        follow(rank - 1, *args)


def bundle(device_type: str) -> dict[str, float]:
    return {"GPU": 1} if device_type == "cuda" else {"CPU": 1}


class RayFollowers:
    """Ranks 1..N-1 as Ray actors, one per bundle of a placement group; `TrainerRanks` drives them as it does
    local processes (`ranks.LocalFollowers`)."""

    def __init__(self, placement: RayPlacement, size: int, port: int, rank_args: tuple, device_type: str):
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rstar.server.ray_replicas import require_ray

        ray = require_ray()
        ray_cluster.join_blocking(placement.address)
        self.size = size
        self.actors: list = []
        self.group = None
        try:
            self.address = ray.util.get_node_ip_address()  # rank 0 listens here, on this node
            wanted = bundle(device_type)
            self._check_room(ray, wanted, size - 1)
            self.group = placement_group([wanted] * (size - 1), strategy="PACK", name=f"rstar-trainer-ranks-{os.getpid()}")
            ready, _ = ray.wait([self.group.ready()], timeout=PLACEMENT_TIMEOUT_S)
            if not ready:
                raise NoRoomForRanks(f"trainer_ranks {size}: the Ray cluster found no room for {size - 1} bundles of {wanted} within "
                                 f"{PLACEMENT_TIMEOUT_S:.0f} s (resources in use by others); try again, or use fewer --trainer-ranks")
            actor_class = ray.remote(TrainerRankActor)
            resources = {"num_gpus": 1, "num_cpus": 0} if device_type == "cuda" else {"num_cpus": 1}
            self.actors = [
                actor_class.options(scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=i), **resources).remote()
                for i in range(size - 1)
            ]
            self.pids = ray.get([actor.pid.remote() for actor in self.actors])
            self.runs = [actor.follow.remote(rank, size, self.address, port, *rank_args) for rank, actor in enumerate(self.actors, start=1)]
        except BaseException:
            self._release(ray, remove_placement_group)
            raise

    @staticmethod
    def _check_room(ray, wanted: dict[str, float], bundles: int) -> None:
        """NoRoomForRanks naming the problem and the fix when the whole cluster has fewer devices than the ranks need
        (a group that can never be placed would otherwise wait forever)."""
        kind = next(iter(wanted))
        total = int(ray.cluster_resources().get(kind, 0))
        if total < bundles:
            raise NoRoomForRanks(f"trainer_ranks {bundles + 1}: ranks 1..{bundles} need one {kind} each on the Ray cluster, which has {total} "
                             f"(rank 0 runs here, beside the engine); use --trainer-ranks {total + 1} or fewer, or add nodes")

    def all_alive(self) -> bool:
        import ray

        finished, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        return not finished

    def first_dead(self) -> str | None:
        """Which rank's actor ended, and why, or None when all still run (a follower ends only when told to stop)."""
        import ray

        finished, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=1)
        for rank, run in enumerate(self.runs, start=1):
            if run in finished:
                try:
                    ray.get(run)
                    why = "ended"
                except Exception as exc:  # RayActorError for a killed process, else the rank's own error
                    why = f"died ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                return f"trainer rank {rank} of {self.size} (Ray actor, pid {self.pids[rank - 1]}) {why}"
        return None

    def stop(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        ray.wait(self.runs, num_returns=len(self.runs), timeout=60)  # told to stop: each returns from `follow`
        self._release(ray, remove_placement_group)

    def _release(self, ray, remove_placement_group) -> None:
        for actor in self.actors:
            ray.kill(actor)
        if self.group is not None:
            remove_placement_group(self.group)
        ray_cluster.leave_blocking()
