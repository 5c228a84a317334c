"""Golden files: expected outputs kept under tests/golden/, compared byte for byte.

Regenerate after a deliberate change with `RSTAR_UPDATE_GOLDEN=1 pytest tests/unit`, then review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"


def check_text(name: str, actual: str) -> None:
    path = GOLDEN_DIR / name
    if os.environ.get("RSTAR_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
    assert path.exists(), f"missing golden file {path}; create it with RSTAR_UPDATE_GOLDEN=1"
    assert actual == path.read_text(encoding="utf-8"), f"output differs from golden file {path}"


def check_json(name: str, actual) -> None:
    check_text(name, json.dumps(actual, indent=1, ensure_ascii=False) + "\n")


def load_json(name: str):
    return json.loads((GOLDEN_DIR / name).read_text(encoding="utf-8"))
