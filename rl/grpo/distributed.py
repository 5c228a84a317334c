"""One trainer rank of N: its process group, the policy sharded with FSDP2, and the global sums the update needs.

FSDP2 (`torch.distributed.fsdp.fully_shard`) keeps on each rank 1/N of every parameter, of its gradient and
(since AdamW's states are shaped like the parameters it steps) of the optimizer's moments; a layer's full
weights exist only while that layer computes (all-gather before, reduce-scatter of gradients after).

What makes N ranks compute the update one rank would:

- the loss is a token mean over the GLOBAL batch: each rank divides its sum by the token count of all ranks
  (`World.sum`), and the gradients are summed across ranks, not averaged (`set_gradient_divide_factor(1)`);
- the gradient norm that is clipped is the global one (DTensor norms reduce across ranks);
- every rank runs the same number of forward and backward passes, since each pass is a collective: a rank
  with fewer rows runs padding rows whose loss is multiplied by zero (the trainer does this).

Backends: gloo on CPU (tested here), NCCL on CUDA; ROCm builds of torch answer to "cuda" and "nccl" and run RCCL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from rstar.rl.policy import Policy

# A rank that dies leaves the others in a collective; gloo notices a closed socket at once, but a hung peer
# only at this timeout.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True)
class World:
    """This process's place among the trainer ranks. `World()` is one rank alone: no collective runs."""

    rank: int = 0
    size: int = 1

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of `values` over all ranks (float64, so token counts stay exact)."""
        if self.size == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def max(self, value: int) -> int:
        if self.size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())


def backend(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def collective_device() -> torch.device:
    # NCCL reduces only device tensors; gloo only CPU ones.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def join(rank: int, size: int, address: str, port: int, device_type: str) -> World:
    """Join the trainer's process group (every rank calls this with the same address, port and size)."""
    if device_type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())  # one rank per GPU on this node
    dist.init_process_group(backend(device_type), init_method=f"tcp://{address}:{port}", rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT)
    return World(rank, size)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def check_world_size(ranks: int, device_type: str | None = None) -> None:
    """ValueError naming the problem and the fix when this machine cannot hold `ranks` ranks (one per core or GPU)."""
    from rstar.hardware import accelerator, usable_cores

    device_type = device_type or accelerator()
    if ranks < 1:
        raise ValueError(f"trainer_ranks must be at least 1, got {ranks}")
    if device_type == "cuda":
        found, what = torch.cuda.device_count(), "GPU"
    else:
        found, what = len(usable_cores()), "CPU core"
    if ranks > found:
        raise ValueError(f"trainer_ranks {ranks}: this machine has {found} {what}{'s' if found != 1 else ''} and each rank needs one; "
                         f"use --trainer-ranks {found} or fewer")


def shard(policy: Policy, world: World) -> None:
    """Shard the policy's weights across the world (FSDP2): each decoder layer its own unit, then the root.

    The root is the policy's forward module (what `Policy.logprobs` calls), so FSDP's root hooks run on each
    logprobs pass; it holds the embeddings, the final norm and the output head (tied to the embeddings in
    small models, and a tied pair must live in one unit). Build the optimizer after this: sharding replaces
    the parameters. A LoRA policy shards the same way: each layer's unit holds its frozen base weights and its
    trained adapters, and only the adapters have gradients to reduce.
    """
    from torch.distributed.fsdp import fully_shard

    for layer in policy.causal_lm.get_decoder().layers:
        fully_shard(layer)
    root = fully_shard(policy.forward_module)
    for module in root.modules():
        if hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(1.0)  # sum across ranks: each rank's loss is already over the global count
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    policy.sharded = True


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip to the global gradient norm and return it; on sharded parameters the norm reduces across ranks."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm.item()


def local_bytes(tensors) -> int:
    """Bytes this rank holds for these tensors (a sharded tensor's local shard only)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def threads_per_rank(ranks: int) -> int:
    """Intra-op threads for each of `ranks` processes on this machine's cores, so ranks do not oversubscribe them."""
    from rstar.hardware import usable_cores

    return max(1, len(usable_cores()) // ranks) if os.environ.get("OMP_NUM_THREADS") is None else int(os.environ["OMP_NUM_THREADS"])
