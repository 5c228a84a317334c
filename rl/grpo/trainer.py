"""One GRPO update: kept samples -> advantages -> packed rows -> token-mean PPO-clip -> AdamW.

Old logprobs "recomputed by the trainer", as released: with one optimizer update per step (the release's
setting), the weights cannot change between the recompute and the training forward, so the training
forward's own logprobs, detached, are exactly the recomputed ones and a second forward would only repeat
them; the ratio is then 1 and the clip matters from the second mini-batch on. With more than one update per
step, a no-grad pass computes them before the first update.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from rstar.rl.checkpoint import read_optimizer_state
from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.distributed import World, clip_grad_norm
from rstar.rl.grpo.loss import group_advantages, policy_loss, token_mean, truncated_is_weights
from rstar.rl.grpo.sharded_checkpoint import has_sharded_state, load_sharded_state, save_sharded_state
from rstar.rl.grpo.samples import Sample
from rstar.rl.memory import release_freed_memory
from rstar.rl.packing import Branch, ForwardBatch, Tree, pack
from rstar.rl.policy import Policy


def training_trees(kept: Sequence[Sequence[Sample]]) -> list[Tree]:
    """One tree per kept group (`Selection.pick`): the shared prompt, and each sample's response with its advantage."""
    trees = []
    for samples in kept:
        advantages = group_advantages([sample.reward for sample in samples])
        branches = []
        for sample, advantage in zip(samples, advantages):
            trajectory = sample.trajectory
            if not trajectory.response_ids:
                continue
            values = {"advantage": [advantage] * len(trajectory.response_ids), "rollout_logprobs": list(trajectory.logprobs)}
            branches.append(Branch(trajectory.response_ids, trajectory.response_mask, values))
        if branches:
            trees.append(Tree(samples[0].trajectory.prompt_ids, branches))
    return trees


def make_optimizer(parameters, config) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with a linear warm-up, then constant (verl's constant-with-warm-up schedule).

    verl's schedule gives step 0 a learning rate of 0; here step k (from 0) gets (k + 1) / warm-up, so the
    first step already learns and step `warmup_steps - 1` reaches the full rate.
    """
    optimizer = torch.optim.AdamW(parameters, lr=config.learning_rate, betas=tuple(config.adam_betas), weight_decay=config.weight_decay)
    warmup = config.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
    return optimizer, scheduler


def split_by_tokens(rows: list[ForwardBatch], parts: int) -> list[list[ForwardBatch]]:
    """Rows in `parts` consecutive chunks of about equal loss-token counts (none empty)."""
    parts = max(1, min(parts, len(rows)))
    total = sum(row.num_loss_tokens for row in rows)
    chunks: list[list[ForwardBatch]] = [[] for _ in range(parts)]
    seen = 0
    for row in rows:
        chunks[min(parts - 1, seen * parts // max(total, 1))].append(row)
        seen += row.num_loss_tokens
    return [chunk for chunk in chunks if chunk]


class GRPOTrainer:
    """The optimizer and the update of one policy; with a `World` of several ranks, of this rank's shards."""

    def __init__(self, policy: Policy, config: GRPOConfig, world: World = World()):
        self.policy = policy
        self.world = world
        self.optimizer, self.scheduler = make_optimizer(policy.trainable_parameters(), config)

    def reset_optimizer(self, config: GRPOConfig) -> None:
        """Fresh AdamW moments and warm-up (the paper's stage 3)."""
        self.optimizer, self.scheduler = make_optimizer(self.policy.trainable_parameters(), config)

    def save_training_state(self, directory: Path) -> None:
        save_sharded_state(self, directory)

    def load_training_state(self, checkpoint: Path) -> None:
        """Weights, AdamW and the schedule from a checkpoint: sharded (written on any number of ranks) or, written
        before sharded checkpoints, `model.safetensors` and `optimizer.pt`."""
        if has_sharded_state(checkpoint):
            load_sharded_state(self, checkpoint)
            return
        self.policy.load_weights(checkpoint)
        self.load_optimizer_state(read_optimizer_state(checkpoint))

    def load_optimizer_state(self, state: dict) -> None:
        if "sharded_ranks" in state:  # written by sharded ranks before sharded checkpoints: whole, keyed by parameter name
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(self.policy.causal_lm, self.optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def update(self, trees: list[Tree], config: GRPOConfig) -> dict:
        """Train on the trees; returns the step's loss statistics. Runs in a worker thread.

        Sharded, each rank passes its own share of the step's trees (`balance_groups`) and all ranks call this
        together; the statistics returned are the whole step's, the same on every rank.
        """
        started = time.perf_counter()
        world = self.world
        rows = pack(trees, config.token_budget)
        mini_batches = equal_passes(split_by_tokens(rows, config.mini_batches_per_step), world)
        old: dict[int, torch.Tensor] = {}
        if config.old_logprobs == "trainer" and len(mini_batches) > 1:
            with torch.no_grad():
                old = {id(row): self.policy.logprobs(row, config.temperature) for batch in mini_batches for row, _ in batch}

        totals = {"loss": 0.0, "clip_frac": 0.0, "dual_clip_frac": 0.0, "ratio_mean": 0.0, "approx_kl": 0.0, "logprob_gap": 0.0}
        grad_norms, skipped = [], 0
        (num_tokens,) = world.sum([sum(row.num_loss_tokens for row in rows)])
        for batch in mini_batches:
            (batch_tokens,) = world.sum([sum(row.num_loss_tokens for row, real in batch if real)])
            self.optimizer.zero_grad(set_to_none=True)
            for row, real in batch:
                logprobs = self.policy.logprobs(row, config.temperature)
                rollout = row.values["rollout_logprobs"].to(logprobs.device)
                if config.old_logprobs == "rollout":
                    old_logprobs = rollout
                else:
                    old_logprobs = old.get(id(row), logprobs.detach())
                weights = truncated_is_weights(old_logprobs, rollout, config.tis_cap) if config.tis_cap else None
                loss_sum, stats = policy_loss(
                    logprobs, old_logprobs, row.values["advantage"].to(logprobs.device), torch.ones_like(logprobs, dtype=torch.bool),
                    config.clip_low, config.clip_high, config.dual_clip, weights,
                )
                if not real:  # a padding pass: its collectives run, its gradient is zero
                    (loss_sum * 0.0).backward()
                    continue
                token_mean(loss_sum, batch_tokens).backward()
                share = row.num_loss_tokens / num_tokens
                totals["loss"] += loss_sum.item() / num_tokens
                for key in ("clip_frac", "dual_clip_frac", "ratio_mean", "approx_kl"):
                    totals[key] += stats[key] * share
                totals["logprob_gap"] += (logprobs.detach() - rollout).abs().sum().item() / num_tokens
            grad_norm = clip_grad_norm(self.policy.trainable_parameters(), config.grad_clip)
            if math.isfinite(grad_norm):
                self.optimizer.step()
            else:  # as verl does: a non-finite gradient skips the update instead of corrupting the weights
                skipped += 1
            grad_norms.append(grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        summed = world.sum([*totals.values(), len(rows), sum(row.num_tokens for row in rows)])
        totals = dict(zip(totals, summed))
        release_freed_memory()  # the engine generates next, beside this process
        return {
            **totals,
            "grad_norm": max(grad_norms),
            "updates_skipped": skipped,
            "lr": lr,
            "train_tokens": int(num_tokens),
            "packed_tokens": int(summed[-1]),
            "rows": int(summed[-2]),
            "train_s": time.perf_counter() - started,
        }


# What a rank with fewer rows than another runs to keep the collectives in step: one token, no loss.
PADDING_TREE = Tree([0], [Branch([0], [1], {"advantage": [0.0], "rollout_logprobs": [0.0]})])


def equal_passes(mini_batches: list[list[ForwardBatch]], world: World) -> list[list[tuple[ForwardBatch, bool]]]:
    """Mini-batches of (row, real) with as many of each, and as many rows in each, as on any rank.

    Every forward and backward of a sharded model is a collective, so all ranks must run the same number of
    them; a rank short of rows runs padding rows (real False). One rank alone gets its rows unchanged.
    """
    count = world.max(len(mini_batches))
    mini_batches = mini_batches + [[] for _ in range(count - len(mini_batches))]
    padded = []
    for batch in mini_batches:
        rows = world.max(len(batch))
        padding = pack([PADDING_TREE], 2) * (rows - len(batch))
        padded.append([(row, True) for row in batch] + [(row, False) for row in padding])
    return padded
