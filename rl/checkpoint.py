"""Checkpoints: model, optimizer, data cursor and RNG state, written so that a crash never leaves a torn one.

A checkpoint is a directory `checkpoint-N` (N = steps finished) holding a complete model the engine and
`rstar serve --model` load (weights, config, tokenizer and chat template), plus `optimizer.pt` and
`trainer_state.json` (a GRPO run writes its training state sharded instead: `grpo/sharded_checkpoint.py`). It is written under a temporary name, flushed to disk (files, then directories) and
renamed in one step; `latest` (a text file, itself replaced atomically and flushed) names the newest, and
moves only once the checkpoint it names is on disk. A checkpoint being replaced (a step redone after a resume)
is moved aside first and removed only after, so a power loss at any point leaves a usable checkpoint. A write
that fails (disk full) removes its partial directory and raises, leaving the previous checkpoint as it was.
Reading back trusts nothing in the run directory: `latest` must name a `checkpoint-N` of the run, and the
optimizer state loads as tensors and plain data only (torch.load weights_only), never as pickled code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

LATEST = "latest"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
CHECKPOINT_NAME = re.compile(r"checkpoint-[0-9]+")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or does not fit this run; the message says which and why."""


@dataclass
class TrainerState:
    step: int  # steps finished
    data_cursor: int  # problems consumed from the run's shuffled order
    model_identity: dict  # architecture and shapes (policy.model_identity): a checkpoint only loads into its own model
    rng: dict = field(default_factory=dict)  # python random (RoC draws) and torch states
    extra: dict[str, Any] = field(default_factory=dict)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / f"checkpoint-{step}"


def write_checkpoint(run_dir: Path, state: TrainerState, write_model: Callable[[Path], None], optimizer_state: dict | Callable[[Path], None]) -> Path:
    """Write checkpoint-{state.step} atomically; `write_model(dir)` puts the model files in place. `optimizer_state`
    is saved as `optimizer.pt`, or, a callable, writes the training state itself (GRPO's sharded one)."""
    target = checkpoint_dir(run_dir, state.step)
    tag = uuid.uuid4().hex[:8]
    partial, aside = run_dir / f".{target.name}.partial-{tag}", run_dir / f".{target.name}.replaced-{tag}"
    try:
        partial.mkdir(parents=True)
        write_model(partial)
        if callable(optimizer_state):
            optimizer_state(partial)
        else:
            torch.save(optimizer_state, partial / OPTIMIZER_FILE)
        (partial / STATE_FILE).write_text(json.dumps(asdict(state), indent=1))
        _fsync_tree(partial)
        if target.exists():  # a step redone after a resume: the new one replaces it
            os.replace(target, aside)
        os.replace(partial, target)
        _fsync(run_dir)
        _write_text_atomically(run_dir / LATEST, target.name)
        shutil.rmtree(aside, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if aside.exists() and not target.exists():
            os.replace(aside, target)
        previous = latest_checkpoint(run_dir)
        kept = f"the previous checkpoint ({previous.name}) is intact" if previous else "there is no earlier checkpoint"
        raise CheckpointError(f"could not write checkpoint {state.step} in {run_dir}: {exc.strerror or exc}; {kept}") from exc
    return target


def _write_text_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    temporary.write_text(text)
    _fsync(temporary)
    os.replace(temporary, path)
    _fsync(path.parent)


def _fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to disk."""
    descriptor = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(root: Path) -> None:
    """Every file under `root`, then every directory from the deepest up: a rename after it cannot reach the
    disk before the data it names."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            _fsync(Path(directory, name))
        _fsync(Path(directory))


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `latest` names, or None: it must name a complete `checkpoint-N` directly in the run dir
    (a pointer anyone with write access planted elsewhere names nothing)."""
    pointer = run_dir / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    if not CHECKPOINT_NAME.fullmatch(name):
        return None
    path = run_dir / name
    return path if path.is_dir() and not path.is_symlink() and (path / STATE_FILE).is_file() else None


def read_state(checkpoint: Path, expected_identity: dict) -> TrainerState:
    state = TrainerState(**json.loads((checkpoint / STATE_FILE).read_text()))
    if state.model_identity != expected_identity:
        differences = {key: (state.model_identity.get(key), value) for key, value in expected_identity.items() if state.model_identity.get(key) != value}
        raise CheckpointError(f"{checkpoint} belongs to another model (checkpoint vs this run: {differences}); start a new run or pass its model")
    return state


def read_optimizer_state(checkpoint: Path) -> dict:
    return torch.load(checkpoint / OPTIMIZER_FILE, weights_only=True)


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Remove all but the newest `keep` checkpoints; returns what was removed."""
    found = sorted((p for p in run_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()), key=lambda p: int(p.name.split("-")[-1]))
    removed = found[: max(len(found) - keep, 0)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
