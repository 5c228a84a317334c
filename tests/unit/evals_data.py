"""Where the evals tests read the offline benchmark copies: RSTAR_TEST_DATA_DIR, else ../shared/data.

CI clones the repo into a fresh folder with shared/ beside it, so the default is resolved from the repo root,
not from the working directory. A missing directory is an error, never a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    configured = os.environ.get("RSTAR_TEST_DATA_DIR")
    path = Path(configured) if configured else REPO_ROOT.parent / "shared" / "data"
    if not (path / "ifeval").is_dir():
        raise RuntimeError(
            f"benchmark data not found at {path} (set RSTAR_TEST_DATA_DIR to the shared/data directory)"
        )
    return path
