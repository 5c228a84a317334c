"""The shipped LoRA delta: merged exactly onto its own base, refused on any other, and the tuned default
model pulled as base + delta with the template it was trained on."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from rstar.server import model_store
from rstar.server.lora_delta import DeltaMismatch, merge_delta, read_metadata, write_delta


def make_base(directory, scale: float = 1.0):
    directory.mkdir(parents=True, exist_ok=True)
    weights = {"model.layers.0.q_proj.weight": torch.full((4, 3), scale), "model.norm.weight": torch.ones(3)}
    save_file(weights, str(directory / "model.safetensors"))
    (directory / "config.json").write_text('{"model_type": "llama"}')
    return weights


def adapters(rank: int = 2, out: int = 4, inp: int = 3):
    torch.manual_seed(0)
    return {"model.layers.0.q_proj": (torch.randn(rank, inp), torch.randn(out, rank), 0.5)}


def test_merge_adds_scale_times_b_at_a(tmp_path):
    base = make_base(tmp_path / "base")
    delta = tmp_path / "delta.safetensors"
    write_delta(delta, adapters(), tmp_path / "base", {"run_id": "x"})
    assert json.loads(read_metadata(delta)["provenance"]) == {"run_id": "x"}
    merge_delta(tmp_path / "base", delta, tmp_path / "merged")
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    a, b, scale = adapters()["model.layers.0.q_proj"]
    expected = base["model.layers.0.q_proj.weight"] + scale * (b.half().float() @ a.half().float())  # stored in fp16
    assert torch.allclose(merged["model.layers.0.q_proj.weight"], expected, atol=1e-6)
    assert torch.equal(merged["model.norm.weight"], base["model.norm.weight"])
    assert merged["model.norm.weight"].dtype == torch.float32


def test_a_delta_is_refused_on_another_base(tmp_path):
    make_base(tmp_path / "base")
    write_delta(tmp_path / "delta.safetensors", adapters(), tmp_path / "base", {})
    make_base(tmp_path / "other", scale=2.0)
    with pytest.raises(DeltaMismatch, match="was trained on base weights with sha256"):
        merge_delta(tmp_path / "other", tmp_path / "delta.safetensors", tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_a_delta_of_the_wrong_shape_is_refused(tmp_path):
    make_base(tmp_path / "base")
    write_delta(tmp_path / "delta.safetensors", adapters(out=5), tmp_path / "base", {})
    with pytest.raises(DeltaMismatch, match="delta is 5x3 \\(rank 2\\), the base weight is \\(4, 3\\)"):
        merge_delta(tmp_path / "base", tmp_path / "delta.safetensors", tmp_path / "merged")


def test_a_file_that_is_not_a_delta_is_refused(tmp_path):
    make_base(tmp_path / "base")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "not-a-delta.safetensors"))
    with pytest.raises(DeltaMismatch, match="not a LoRA delta file"):
        merge_delta(tmp_path / "base", tmp_path / "not-a-delta.safetensors", tmp_path / "merged")


@pytest.fixture
def fake_tuned(tmp_path, monkeypatch):
    """A TunedModel over a fake base entry already in the cache and a delta in a fake package dir."""
    models = tmp_path / "cache"
    base = replace(model_store.SMOLLM2_135M, name="Base")
    base_dir = models / "Base"
    make_base(base_dir)
    (base_dir / "tokenizer.json").write_text("{}")
    model_store._write_manifest(base_dir, source=model_store.entry_source(base))  # as if pulled
    package = tmp_path / "package"
    package.mkdir()
    write_delta(package / "d.safetensors", adapters(), base_dir, {})
    monkeypatch.setattr(model_store, "MODELS_DIR", package)
    tuned = replace(model_store.SMOLLM2_135M_TOOL, name="Tuned", base=base, delta_file="d.safetensors",
                    delta_sha256=model_store.sha256_file(package / "d.safetensors"))
    return models, tuned, package


def test_pull_merges_the_delta_and_writes_the_rstar_template(fake_tuned):
    models, tuned, _ = fake_tuned
    path = model_store.pull_embedded_model(models, tuned)
    assert path == models / "Tuned" and model_store.cache_problems(path) == []
    assert (path / "chat_template.jinja").read_text() == model_store.RSTAR_TEMPLATE_PATH.read_text()
    assert (path / "tokenizer.json").is_file() and (path / "config.json").is_file()
    assert model_store.pull_embedded_model(models, tuned) == path  # cached: a no-op


def test_a_cached_model_merged_from_another_delta_is_rebuilt(fake_tuned, tmp_path):
    models, tuned, package = fake_tuned
    first = model_store.pull_embedded_model(models, tuned)
    before = (first / "model.safetensors").read_bytes()
    write_delta(package / "d2.safetensors", {"model.layers.0.q_proj": (torch.ones(2, 3), torch.ones(4, 2), 1.0)}, models / "Base", {})
    newer = replace(tuned, delta_file="d2.safetensors", delta_sha256=model_store.sha256_file(package / "d2.safetensors"))
    messages = []
    second = model_store.pull_embedded_model(models, newer, messages.append)
    assert second == first and (second / "model.safetensors").read_bytes() != before
    assert any("this rstar ships" in m for m in messages)


def test_a_damaged_packaged_delta_is_refused(fake_tuned):
    models, tuned, package = fake_tuned
    with open(package / "d.safetensors", "r+b") as handle:
        handle.seek(-1, 2)
        handle.write(b"\x01")
    with pytest.raises(model_store.ModelPullFailed, match="packaged delta is damaged"):
        model_store.pull_embedded_model(models, tuned)
    assert not (models / "Tuned").exists()


def test_default_names_the_tuned_model_and_the_base_stays_available():
    assert model_store.EMBEDDED_MODELS["default"] is model_store.SMOLLM2_135M_TOOL
    assert model_store.EMBEDDED_MODELS["smollm2-135m-instruct"] is model_store.SMOLLM2_135M
    assert "rstar" in model_store.SMOLLM2_135M_TOOL.name.lower()  # served with the rStar template
    shipped = model_store.MODELS_DIR / model_store.SMOLLM2_135M_TOOL.delta_file
    assert shipped.stat().st_size <= 10_000_000
    assert model_store.sha256_file(shipped) == model_store.SMOLLM2_135M_TOOL.delta_sha256
