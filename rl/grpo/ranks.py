"""N sharded trainer ranks: this process is rank 0, ranks 1..N-1 are processes it spawns on this machine or, with
a `RayPlacement`, Ray actors a placement group puts on the cluster (`ray_ranks.py`).

Rank 0 stays in the process that owns the rollout engine, so the weight sync and checkpoints read the full
weights where they are needed: gathered once per step into rank 0's memory, never one copy per rank. The other
ranks run `follow` (started locally with `torch.multiprocessing.start_processes`, spawn), join the same process
group and then follow rank 0: rank 0 broadcasts what to do (`dist.broadcast_object_list`), and every rank does it
together, since every operation on a sharded model is a collective. For an update, each rank then receives its own
share of the step's groups (`dist.scatter_object_list`), not the whole step.

    with TrainerRanks(model_dir, "float32", config, size=2) as ranks:
        stats = ranks.update(trees, config)    # the step's groups balanced by tokens across the ranks, never split
        weights = ranks.full_state_dict()      # gathered into rank 0, for the weight sync
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rstar.rl.checkpoint import CheckpointError
from rstar.rl.grpo.balance import balance_groups
from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.distributed import World, check_world_size, free_port, join, leave, shard, threads_per_rank
from rstar.rl.grpo.sharded_checkpoint import has_sharded_state, load_sharded_state, save_sharded_state
from rstar.rl.grpo.trainer import GRPOTrainer
from rstar.rl.packing import Tree
from rstar.rl.policy import Policy, device_type

if TYPE_CHECKING:
    from rstar.rl.grpo.ray_ranks import RayPlacement

ADDRESS = "127.0.0.1"


def tree_tokens(tree: Tree) -> int:
    """What a group costs a forward pass: its prompt once and every response."""
    return len(tree.prefix) + sum(len(branch.token_ids) for branch in tree.branches)


def split_trees(trees: Sequence[Tree], ranks: int) -> list[list[Tree]]:
    return [[trees[i] for i in share] for share in balance_groups([tree_tokens(t) for t in trees], ranks)]


def sharded_trainer(model_dir: Path, compute_dtype: str, config: GRPOConfig, world: World) -> GRPOTrainer:
    # Every rank draws the same LoRA A factors (the one-rank trainer's too): FSDP2 shards each rank's own copy.
    torch.manual_seed(config.seed)
    policy = Policy(model_dir, compute_dtype, lora=config.lora(), gradient_checkpointing=config.gradient_checkpointing)
    shard(policy, world)
    return GRPOTrainer(policy, config, world)


class RankDied(RuntimeError):
    """A trainer rank's process ended during a run; the message names the rank and its exit code."""


class TrainerRanks:
    """The trainer's ranks, driven from rank 0. Every method is one step of all ranks together."""

    def __init__(self, model_dir: Path, compute_dtype: str, config: GRPOConfig, size: int, placement: "RayPlacement | None" = None):
        self.size = size
        port = free_port()
        threads = threads_per_rank(size)
        rank_args = (str(model_dir), compute_dtype, config, threads)
        if placement is None:
            check_world_size(size)
            self.followers = LocalFollowers(size, port, rank_args)
        else:
            from rstar.rl.grpo.ray_ranks import RayFollowers

            self.followers = RayFollowers(placement, size, port, rank_args, device_type())
        torch.set_num_threads(threads)
        try:
            self.world = join(0, size, self.followers.address, port, device_type())
            self.trainer = sharded_trainer(Path(model_dir), compute_dtype, config, self.world)
        except BaseException:
            self.followers.stop()
            raise
        self.policy = LeaderPolicy(self.trainer.policy, self._tell)

    def update(self, trees: Sequence[Tree], config: GRPOConfig) -> dict:
        """One update of the whole step on all ranks; the step's statistics."""
        self._tell("update", config)
        with self._naming_a_dead_rank():
            mine = [None]
            dist.scatter_object_list(mine, split_trees(trees, self.size), src=0)  # each rank receives its own share only
            return self.trainer.update(mine[0], config)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights, gathered into this process (rank 0) in CPU memory."""
        return dict(self.policy.merged_state_dict())

    def reset_optimizer(self, config: GRPOConfig) -> None:
        self._tell("reset", config)
        self.trainer.reset_optimizer(config)

    def save_training_state(self, directory: Path) -> None:
        """Every rank writes its own shards into `directory` (torch.distributed.checkpoint)."""
        self._tell("save", str(directory))
        save_sharded_state(self.trainer, directory)

    def load_training_state(self, checkpoint: Path) -> None:
        """Every rank reads its shards from a checkpoint written on any number of ranks."""
        if not has_sharded_state(checkpoint):
            raise CheckpointError(f"{checkpoint.name} was written before sharded checkpoints (AdamW gathered whole in optimizer.pt) and resumes only on "
                                  f"one rank: run the same command with --trainer-ranks 1; its next checkpoint resumes on any number of ranks")
        self._tell("load", str(checkpoint))
        load_sharded_state(self.trainer, checkpoint)

    def close(self) -> None:
        try:
            if self.followers.all_alive():  # else the error that ends the run is already raised
                self._tell("stop")
        finally:
            self.followers.stop()
            leave()

    def _tell(self, *command) -> None:
        with self._naming_a_dead_rank():
            dist.broadcast_object_list([command], src=0)

    @contextlib.contextmanager
    def _naming_a_dead_rank(self):
        """A collective that fails because a rank's process died (kill -9, out of memory) says which rank; gloo's
        own error names only a closed socket."""
        try:
            yield
        except RuntimeError as exc:
            if dead := self.followers.first_dead():
                raise RankDied(f"{dead}; the run stops here and the same command resumes it from its last checkpoint") from exc
            raise

    def __enter__(self) -> "TrainerRanks":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalFollowers:
    """Ranks 1..N-1 as processes on this machine, joining rank 0 on the loopback address."""

    address = ADDRESS

    def __init__(self, size: int, port: int, rank_args: tuple):
        self.size = size
        self.context = mp.start_processes(follow, args=(size, ADDRESS, port, *rank_args), nprocs=size - 1, join=False, start_method="spawn")
        self.processes = self.context.processes

    def all_alive(self) -> bool:
        return all(process.is_alive() for process in self.processes)

    def first_dead(self) -> str | None:
        """Which rank died and how, or None when all live."""
        for rank, process in enumerate(self.processes, start=1):
            process.join(timeout=1)  # reap it: a process killed a moment ago may not show as dead yet
            if not process.is_alive():
                return f"trainer rank {rank} of {self.size} (pid {process.pid}) died with exit code {process.exitcode}"
        return None

    def stop(self) -> None:
        try:
            self.context.join(timeout=60)
        except mp.ProcessExitedException:  # a rank that died: its error is the one already raised
            pass
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join()


class LeaderPolicy:
    """Rank 0's view of the sharded policy, for the weight sync and checkpoints: what reads the whole model
    (gathering the weights, a forward for the probe) first tells the other ranks to take their part."""

    def __init__(self, policy: Policy, tell):
        self.inner = policy
        self.tell = tell

    @property
    def causal_lm(self):
        return self.inner.causal_lm

    @property
    def lora(self):
        return self.inner.lora

    def merged_state_dict(self):
        self.tell("gather")
        yield from self.inner.merged_state_dict()

    def no_grad_logprobs(self, batch, temperature: float = 1.0, weights_dtype: torch.dtype | None = None) -> torch.Tensor:
        self.tell("logprobs", batch, temperature, weights_dtype)
        return self.inner.no_grad_logprobs(batch, temperature, weights_dtype)

    def save_pretrained(self, out_dir: Path) -> None:
        self.tell("gather")  # save_pretrained gathers the weights once
        self.inner.save_pretrained(out_dir)

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        self.tell("adapter")
        return self.inner.adapter_state_dict()

    def save_adapter(self, out_dir: Path, dtype: torch.dtype | None = None) -> int:
        self.tell("adapter")  # save_adapter gathers the adapter once
        return self.inner.save_adapter(out_dir, dtype)


def follow(index: int, size: int, address: str, port: int, model_dir: str, compute_dtype: str, config: GRPOConfig, threads: int) -> None:
    """Rank `index + 1` of 1..N-1, wherever it runs (a spawned process, a Ray actor): join rank 0's process group at
    `address:port`, then do what rank 0 says until it says stop."""
    torch.set_num_threads(threads)
    rank = index + 1
    world = join(rank, size, address, port, device_type())
    try:
        trainer = sharded_trainer(Path(model_dir), compute_dtype, config, world)
        while True:
            message = [None]
            dist.broadcast_object_list(message, src=0)
            command, *args = message[0]
            if command == "update":
                mine = [None]
                dist.scatter_object_list(mine, None, src=0)
                trainer.update(mine[0], *args)
            elif command == "gather":
                for _ in trainer.policy.merged_state_dict():
                    pass  # this rank's part of the gather; the full tensors land on rank 0
            elif command == "adapter":
                trainer.policy.adapter_state_dict()  # likewise, the adapter's tensors only
            elif command == "logprobs":
                trainer.policy.no_grad_logprobs(*args)
            elif command == "save":
                save_sharded_state(trainer, Path(args[0]))
            elif command == "load":
                load_sharded_state(trainer, Path(args[0]))
            elif command == "reset":
                trainer.reset_optimizer(args[0])
            elif command == "stop":
                return
            else:
                raise ValueError(f"rank {rank}: unknown command {command!r}")
    finally:
        leave()
