"""Sharded trainer ranks (FSDP2, gloo) against one unsharded rank: what each rank holds, and the step time.

Both sides train the default model (SmolLM2-135M, fp32 master weights, AdamW) on the same step of synthetic
GRPO groups (seeded random tokens: a shared prompt, responses of mixed lengths, advantages +-1), one after the
other in this process: one rank alone (`GRPOTrainer`, every core), then `TrainerRanks` with two ranks (this
process rank 0, one spawned; the cores split between them).

Memory is what the update keeps between steps, counted from the tensors themselves after the first update
(AdamW creates its moments there): parameters, gradients and the optimizer's state on rank 0. FSDP2 cuts every
tensor along its first dimension into equal chunks, rank 0's the first and never smaller, so rank 0's figure is
the largest of the ranks'. Activations, and the full weights a rank gathers for one layer at a time, come and go
within a step and are not counted.

Step time: one warm-up update, then the measured ones. Not a goal on this machine: two ranks share two cores,
and each adds collectives; what sharding buys here is memory.

    python benchmarks/trainer_ranks_bench.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
from pathlib import Path

from goals import goal, run_header, write_report

HERE = Path(__file__).resolve().parent
MODEL = "smollm2-135m-instruct"


def workload(groups: int, samples: int, seed: int = 0):
    from rstar.rl.packing import Branch, Tree

    rng = random.Random(seed)
    vocab = 49152

    def tokens(n):
        return [rng.randrange(5, vocab) for _ in range(n)]

    trees = []
    for _ in range(groups):
        branches = []
        for index in range(samples):
            n = rng.randrange(24, 97)
            advantage = 1.0 if index % 2 == 0 else -1.0
            branches.append(Branch(tokens(n), [1] * n, {"advantage": [advantage] * n, "rollout_logprobs": [-2.0] * n}))
        trees.append(Tree(tokens(rng.randrange(64, 129)), branches))
    return trees


def held_bytes(trainer) -> dict:
    """Bytes this rank holds for parameters, gradients and optimizer states (local shards only)."""
    import torch

    from rstar.rl.grpo.distributed import local_bytes

    parameters = trainer.policy.trainable_parameters()
    states = [value for state in trainer.optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor) and value.dim() > 0]
    held = {
        "parameters": local_bytes(parameters),
        "gradients": local_bytes(p.grad for p in parameters if p.grad is not None),
        "optimizer": local_bytes(states),
    }
    return held | {"total": sum(held.values())}


def timed_updates(update, trees, config, steps: int) -> tuple[list[float], dict]:
    update(trees, config)  # warm-up; also creates AdamW's state
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        stats = update(trees, config)
        times.append(time.perf_counter() - started)
    return times, stats


def run(quick: bool) -> dict:
    import torch

    from rstar.config import load_settings
    from rstar.rl.grpo.config import GRPOConfig
    from rstar.rl.grpo.ranks import TrainerRanks
    from rstar.rl.grpo.trainer import GRPOTrainer
    from rstar.rl.policy import Policy, resolve_compute_dtype
    from rstar.server.model_store import resolve_model

    model_dir = resolve_model(MODEL, load_settings().models_dir).path
    groups, samples, steps = (2, 4, 1) if quick else (4, 4, 2)
    trees = workload(groups, samples)
    dtype, why = resolve_compute_dtype("auto")
    config = GRPOConfig(learning_rate=1e-6, warmup_steps=0, compute_dtype=dtype)
    result: dict = {"model_dir": str(model_dir), "compute_dtype": dtype, "compute_dtype_why": why,
                    "workload": {"groups": groups, "samples_per_group": samples, "measured_steps": steps,
                                 "loss_tokens": sum(len(b.token_ids) for t in trees for b in t.branches),
                                 "computed_tokens": sum(len(t.prefix) + sum(len(b.token_ids) for b in t.branches) for t in trees)}}

    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    single = GRPOTrainer(Policy(model_dir, dtype), config)
    times, stats = timed_updates(single.update, trees, config, steps)
    result["one_rank"] = {"threads": cores, "held_bytes": held_bytes(single), "step_s": times, "loss": stats["loss"], "grad_norm": stats["grad_norm"]}
    print(f"one rank: {statistics.median(times):.1f} s/step, holds {result['one_rank']['held_bytes']['total'] / 2**20:.0f} MiB", flush=True)
    del single
    gc.collect()

    with TrainerRanks(model_dir, dtype, config, size=2) as ranks:
        times, stats = timed_updates(ranks.update, trees, config, steps)
        result["two_ranks"] = {"threads_per_rank": torch.get_num_threads(), "held_bytes_rank0": held_bytes(ranks.trainer), "step_s": times,
                               "loss": stats["loss"], "grad_norm": stats["grad_norm"]}
        started = time.perf_counter()
        gathered = ranks.full_state_dict()
        result["two_ranks"]["gather_full_state_dict_s"] = time.perf_counter() - started
        result["two_ranks"]["gathered_bytes_rank0"] = sum(t.numel() * t.element_size() for t in gathered.values())
    print(f"two ranks: {statistics.median(times):.1f} s/step, rank 0 holds {result['two_ranks']['held_bytes_rank0']['total'] / 2**20:.0f} MiB", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 groups of 4 and one measured update a side")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "trainer_ranks_bench.json")
    args = parser.parse_args()

    began = time.perf_counter()
    load_before = os.getloadavg()
    result = run(args.quick)
    one, two = result["one_rank"], result["two_ranks"]
    memory_ratio = two["held_bytes_rank0"]["total"] / one["held_bytes"]["total"]
    step_ratio = statistics.median(two["step_s"]) / statistics.median(one["step_s"])
    report = {
        **run_header("trainer_ranks_bench", began, load_before, args.quick),
        "model": MODEL,
        **result,
        "summary": {"memory_per_rank_2_vs_1": memory_ratio, "step_time_2_vs_1": step_ratio,
                    "loss_difference": abs(two["loss"] - one["loss"])},
        "goals": [goal("memory per rank held by parameters, gradients and optimizer states, 2 ranks / 1", memory_ratio, "<=", 0.55, "x")],
    }
    print(f"step time 2 ranks / 1: {step_ratio:.2f}x (reported, not a goal: the ranks share {os.cpu_count()} cores)")
    write_report(args.out, report)


if __name__ == "__main__":
    main()
