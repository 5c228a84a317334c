"""Fixtures every tier shares: the repo, the offline data, the embedded default model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# No test may reach a model or dataset hub; fail fast instead of retrying for half a minute.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded default model, pulled into the user cache for real (a no-op once cached)."""
    from rstar.config import load_settings
    from rstar.server.model_store import resolve_model

    return Path(resolve_model("default", load_settings().models_dir).path)


@pytest.fixture(scope="session")
def default_tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)
