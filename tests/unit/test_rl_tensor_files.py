"""The memory-mapped safetensors writer: files safetensors reads back exactly, in the dtype asked for."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from rstar.rl.tensor_files import write_safetensors


def test_round_trip_with_and_without_conversion(tmp_path):
    tensors = {"a.weight": torch.randn(5, 3), "b.bias": torch.arange(7, dtype=torch.float32), "c": torch.randn(2, 2, 2)[:, 0]}
    path = tmp_path / "model.safetensors"
    size = write_safetensors(tensors.items(), path)
    assert size == path.stat().st_size
    loaded = load_file(str(path))
    assert set(loaded) == set(tensors)
    assert all(torch.equal(loaded[name], tensors[name]) for name in tensors)

    write_safetensors(tensors.items(), path, dtype=torch.bfloat16)
    loaded = load_file(str(path))
    assert all(loaded[name].dtype == torch.bfloat16 and torch.equal(loaded[name], tensors[name].to(torch.bfloat16)) for name in tensors)


def test_a_same_sized_file_is_rewritten_in_place(tmp_path):
    path = tmp_path / "model.safetensors"
    write_safetensors([("w", torch.zeros(4))], path)
    inode = path.stat().st_ino
    write_safetensors([("w", torch.ones(4))], path)
    assert path.stat().st_ino == inode
    assert load_file(str(path))["w"].tolist() == [1.0] * 4
