"""Checkpoints are written whole or not at all: a failing write (disk full) leaves the previous one intact."""

from __future__ import annotations

import errno
import json
from pathlib import Path

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


@pytest.mark.parametrize("pointer", ["../elsewhere", "/tmp", "checkpoint-1/../../elsewhere", "checkpoint-x", "elsewhere"])
def test_latest_must_name_a_checkpoint_of_the_run(tmp_path, pointer):
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, TrainerState(1, 8, IDENTITY), write_model, {})
    planted = tmp_path / "elsewhere"
    planted.mkdir()
    (planted / "trainer_state.json").write_text("{}")
    (run_dir / "latest").write_text(pointer)
    assert latest_checkpoint(run_dir) is None


def test_optimizer_state_loads_as_data_never_as_code(tmp_path):
    import torch

    class Planted:
        def __reduce__(self):
            return (print, ("pickled code ran",))

    path = write_checkpoint(tmp_path, TrainerState(1, 8, IDENTITY), write_model, {})
    torch.save({"optimizer": Planted()}, path / "optimizer.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        read_optimizer_state(path)


def test_a_real_optimizer_and_scheduler_state_round_trips(tmp_path):
    import torch

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    saved = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    loaded = read_optimizer_state(write_checkpoint(tmp_path, TrainerState(1, 8, IDENTITY), write_model, saved))
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], saved["optimizer"]["state"][0]["exp_avg"])
    assert loaded["scheduler"]["last_epoch"] == 1


def test_files_and_directories_are_flushed_before_latest_moves(tmp_path, monkeypatch):
    import rstar.rl.checkpoint as checkpoint

    events = []
    fsync, replace = checkpoint._fsync, checkpoint.os.replace
    monkeypatch.setattr(checkpoint, "_fsync", lambda path: events.append(("fsync", path.name)) or fsync(path))
    monkeypatch.setattr(checkpoint.os, "replace", lambda a, b: events.append(("replace", Path(b).name)) or replace(a, b))
    write_checkpoint(tmp_path, TrainerState(1, 8, IDENTITY), write_model, {})
    synced_before_rename = {name for kind, name in events[: events.index(("replace", "checkpoint-1"))] if kind == "fsync"}
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= synced_before_rename
    assert events.index(("fsync", tmp_path.name)) < events.index(("replace", "latest"))


def test_a_replaced_checkpoint_is_moved_aside_until_the_new_one_is_in_place(tmp_path, monkeypatch):
    import rstar.rl.checkpoint as checkpoint

    write_checkpoint(tmp_path, TrainerState(1, 8, IDENTITY), write_model, {})
    replace = checkpoint.os.replace

    def power_cut(source, target):
        if Path(target).name == "checkpoint-1" and ".partial-" in Path(source).name:
            raise OSError(errno.EIO, "Input/output error")
        return replace(source, target)

    monkeypatch.setattr(checkpoint.os, "replace", power_cut)
    with pytest.raises(CheckpointError):
        write_checkpoint(tmp_path, TrainerState(1, 9, IDENTITY), write_model, {})
    assert read_state(latest_checkpoint(tmp_path), IDENTITY).data_cursor == 8  # the old one, back in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "latest"]
