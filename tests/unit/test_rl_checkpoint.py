"""Checkpoints are written whole or not at all: a failing write (disk full) leaves the previous one intact."""

from __future__ import annotations

import errno
import json

import pytest

from rstar.rl.checkpoint import CheckpointError, TrainerState, latest_checkpoint, prune_checkpoints, read_optimizer_state, read_state, write_checkpoint

IDENTITY = {"model_type": "llama", "hidden_size": 576}


def write_model(directory):
    (directory / "model.safetensors").write_bytes(b"weights")


def test_write_then_read_back(tmp_path):
    state = TrainerState(step=3, data_cursor=24, model_identity=IDENTITY, rng={"torch": [1, 2]}, extra={"stage_problems": ["a"]})
    path = write_checkpoint(tmp_path, state, write_model, {"optimizer": {"lr": 1.0}})
    assert path.name == "checkpoint-3" and latest_checkpoint(tmp_path) == path
    assert read_state(path, IDENTITY) == state
    assert read_optimizer_state(path) == {"optimizer": {"lr": 1.0}}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path):
    write_checkpoint(tmp_path, TrainerState(1, 8, IDENTITY), write_model, {})

    def disk_full(directory):
        (directory / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError, match="No space left on device; the previous checkpoint \\(checkpoint-1\\) is intact"):
        write_checkpoint(tmp_path, TrainerState(2, 16, IDENTITY), disk_full, {})
    assert latest_checkpoint(tmp_path).name == "checkpoint-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "latest"]  # no partial directory left


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    path = write_checkpoint(tmp_path, TrainerState(1, 8, IDENTITY), write_model, {})
    with pytest.raises(CheckpointError, match="belongs to another model.*hidden_size"):
        read_state(path, {**IDENTITY, "hidden_size": 960})


def test_prune_keeps_the_newest(tmp_path):
    for step in (1, 2, 10):
        write_checkpoint(tmp_path, TrainerState(step, 0, IDENTITY), write_model, {})
    removed = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in removed] == ["checkpoint-1"]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-2"]
    assert json.loads((tmp_path / "checkpoint-10" / "trainer_state.json").read_text())["step"] == 10


def test_a_pointer_to_a_missing_checkpoint_is_no_checkpoint(tmp_path):
    (tmp_path / "latest").write_text("checkpoint-7")
    assert latest_checkpoint(tmp_path) is None
