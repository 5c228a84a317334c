"""Weight sync: after each update the rollout engine serves the trainer's new weights, verified.

On vLLM CPU, `load_weights` after start-up fails (its kernels repack parameters); the worker's
`reload_weights(weights_path=...)` works. So the trainer writes
one safetensors file into shared memory (`/dev/shm`, no disk) and the engine reloads from it in place,
bumps its weight version and drops its prefix cache (`VllmEngine.reload_weights`).

A probe then reads the engine's logprobs of a fixed token sequence and the trainer's, and checks two things on
every engine replica (`--replicas N`: each reloads, and any one left on stale weights would feed the batch); a
failed check stops the run loudly (a run that trains on against stale weights is lost without anyone seeing why):

- the gap: engine and trainer agree within the dtype's noise (weights loaded wrong show far above it);
- that the engine followed the update: between two syncs the trainer's logprobs moved by some change, and the
  engine's must have moved along it, at least `MIN_FOLLOWED` of the way (the slope of the engine's change on the
  trainer's), unless the engine's scatter about that slope is too wide to tell (`kept_stale`). A bf16 engine's
  noise floor (0.05-0.08 here) is above what one small step changes, so stale
  weights pass the gap check alone; they do not pass this one, since a reload that kept the old weights leaves
  the engine's logprobs where they were. The trainer's side is computed with its weights rounded to the
  engine's dtype, as the sync sent them (a bf16 copy drops updates smaller than half its step, so the fp32
  masters move further than any bf16 engine can), and a real reload follows it with a slope near 1. Below
  `MIN_TRAINER_CHANGE` the sent weights changed too little to tell, and only the gap is checked.

The file stays for the run's life (a restarted engine replica loads the latest weights from it) and goes when
the run ends. A run killed outright (the OOM killer, SIGKILL) cannot remove it, and memory in /dev/shm stays
taken until someone does: its directory names the trainer's pid, and the next run removes those whose
trainer is gone.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import torch

from rstar.process_temp import owned_temp_dir
from rstar.rl.packing import Branch, Tree, pack
from rstar.rl.policy import Policy, tied_names
from rstar.rl.tensor_files import write_safetensors
from rstar.server.engine import TokenEngine

WEIGHTS_PREFIX = "rstar-weights-"  # then the trainer's pid, a dash and a random part


class WeightSyncFailed(RuntimeError):
    """The engine does not serve the trainer's weights; continuing would train on a different policy."""


# The engine must move at least this share of the way the trainer's probe logprobs moved since the last sync,
# unless its noise leaves a slope of 1 within FOLLOWED_ERRORS standard errors (then the probe cannot tell).
MIN_FOLLOWED = 0.25
FOLLOWED_ERRORS = 4.0
# Mean |change| of the trainer's probe logprobs below which a step is too small to check the engine followed it.
MIN_TRAINER_CHANGE = 1e-3


@dataclass
class SyncReport:
    seconds: float  # write + reload, what the goal counts
    write_s: float
    reload_s: float
    probe_gap: float  # mean |engine logprob - trainer logprob| over the probe tokens (the largest over replicas)
    weight_version: int
    probe_change: float | None = None  # mean |trainer change| since the last sync (None at the first)
    probe_followed: float | None = None  # slope of the engine's change on the trainer's (the least over replicas; None: too small a change to tell)
    probe_followed_error: float | None = None  # that slope's standard error, from the engine's scatter about it
    probe_replicas: int = 1  # engine replicas probed: every healthy one


@dataclass(frozen=True)
class ProbeReading:
    engine: torch.Tensor  # per-token logprobs of the probe sequence
    trainer: torch.Tensor

    @property
    def gap(self) -> float:
        return (self.engine - self.trainer).abs().mean().item()


def followed(before: ProbeReading, after: ProbeReading) -> tuple[float, float | None, float | None]:
    """(mean |trainer change|, slope of the engine's change on it, the slope's standard error) between two
    readings; slope and error are None when the trainer moved less than MIN_TRAINER_CHANGE. Slope 1: the engine
    moved as the trainer did; 0: it stayed. A stale engine repeats its logprobs exactly, so its error is 0."""
    trainer_change = after.trainer - before.trainer
    change = trainer_change.abs().mean().item()
    if change < MIN_TRAINER_CHANGE:
        return change, None, None
    engine_change = after.engine - before.engine
    norm = (trainer_change @ trainer_change).item()
    slope = (engine_change @ trainer_change).item() / norm
    residual = engine_change - slope * trainer_change
    error = ((residual @ residual).item() / max(1, len(residual) - 1) / norm) ** 0.5
    return change, slope, error


def kept_stale(slope: float | None, error: float | None) -> bool:
    """The engine measurably did not follow: it moved under MIN_FOLLOWED of the way, and a full follow (slope 1)
    lies more than FOLLOWED_ERRORS standard errors off. The error guards against bf16 noise: when the step is
    small beside the engine's rounding noise, the slope scatters widely and says nothing either way."""
    return slope is not None and slope < MIN_FOLLOWED and 1 - slope > FOLLOWED_ERRORS * error


class WeightSync:
    """Moves the policy's weights into the engine and checks the engine's logprobs against the trainer's."""

    def __init__(self, engine: TokenEngine, policy: Policy, probe_ids: Sequence[int], tolerance: float, engine_dtype: str, torch_thread: Executor):
        self.engine = engine
        self.torch_thread = torch_thread  # the trainer's one thread for torch work
        self.policy = policy
        self.probe_ids = list(probe_ids)
        self.tolerance = tolerance
        self.last: dict[int, ProbeReading] = {}  # the previous sync's reading of each replica, to check the next one followed
        self.dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(engine_dtype, torch.float32)
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
        self._dir = owned_temp_dir(WEIGHTS_PREFIX, base)

    async def sync(self) -> SyncReport:
        started = time.perf_counter()
        if getattr(self.policy, "lora", None) is not None:  # LoRA: the adapter alone, loaded onto the engine's base
            adapter = Path(self._dir.name) / "adapter"
            await asyncio.get_running_loop().run_in_executor(self.torch_thread, self.policy.save_adapter, adapter, self.dtype)
            written = time.perf_counter()
            await self.engine.load_adapter(adapter)
        else:
            path = Path(self._dir.name) / "model.safetensors"
            tied = tied_names(self.policy.causal_lm)
            weights = ((name, tensor) for name, tensor in self.policy.merged_state_dict() if name not in tied)
            await asyncio.get_running_loop().run_in_executor(self.torch_thread, write_safetensors, weights, path, self.dtype)
            written = time.perf_counter()
            await self.engine.reload_weights(self._dir.name)
        reloaded = time.perf_counter()
        readings = await self.probe()
        version = self.engine.weight_version
        change, slopes = None, []  # slopes: (slope, error) of each replica that could be checked
        for replica, reading in readings.items():
            engine = "the engine" if len(readings) == 1 else f"engine replica {replica}"
            if reading.gap > self.tolerance:
                raise WeightSyncFailed(
                    f"weight-sync probe: after loading weight version {version}, {engine}'s logprobs differ from the trainer's by "
                    f"{reading.gap:.4f} on average (tolerance {self.tolerance}): {engine} is not serving the trained weights"
                )
            change, slope, error = followed(self.last[replica], reading) if replica in self.last else (change, None, None)
            if kept_stale(slope, error):
                raise WeightSyncFailed(
                    f"weight-sync probe: after loading weight version {version}, {engine}'s logprobs moved {slope:.2f} ± {error:.2f} of the way "
                    f"the trainer's did since the last sync (a mean change of {change:.4f}; at least {MIN_FOLLOWED} expected): {engine} kept stale weights"
                )
            slopes += [(slope, error)] if slope is not None else []
        self.last = readings
        least = min(slopes, default=(None, None))
        return SyncReport(reloaded - started, written - started, reloaded - written, max(r.gap for r in readings.values()), version, change,
                          least[0], least[1], len(readings))

    async def probe(self) -> dict[int, ProbeReading]:
        """Every engine replica's logprobs of the probe sequence (by replica index), each beside the trainer's."""
        served = await self.engine.replica_prompt_logprobs(self.probe_ids)
        row = pack([Tree(self.probe_ids[:1], [Branch(self.probe_ids[1:], [1] * (len(self.probe_ids) - 1))])], len(self.probe_ids))[0]
        # The trainer computes with the weights as the sync wrote them (rounded to the engine's dtype), not its fp32 masters.
        trainer_logprobs = await asyncio.get_running_loop().run_in_executor(self.torch_thread, self.policy.no_grad_logprobs, row, 1.0, self.dtype)
        trainer = trainer_logprobs.detach().cpu().float()
        return {replica: ProbeReading(torch.tensor(logprobs).float(), trainer) for replica, logprobs in served.items()}

    def close(self) -> None:
        self._dir.cleanup()
