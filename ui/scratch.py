"""Where the page's downloads are written before Gradio serves them (exported conversations, files the code
wrote): one directory that lives as long as the UI and is removed with it. A UI runs for weeks, so every new
download first prunes the ones older than `max_age_s`; Gradio's own copies of them age out of its cache on the
same clock (`delete_cache` in `build_ui`)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from rstar.process_temp import owned_temp_dir

DOWNLOAD_MAX_AGE_S = 3600.0


class Scratch:
    def __init__(self, max_age_s: float = DOWNLOAD_MAX_AGE_S):
        self._directory = owned_temp_dir("rstar-ui-")  # close() removes it: the app's lifespan calls it
        self.root = Path(self._directory.name)
        self.max_age_s = max_age_s

    def new_dir(self) -> Path:
        """An empty directory for one download's files (they keep their own names)."""
        self.prune()
        return Path(tempfile.mkdtemp(dir=self.root))

    def prune(self, now: float | None = None) -> int:
        """Remove the downloads older than max_age_s; how many were removed."""
        cutoff = (time.time() if now is None else now) - self.max_age_s
        old = [entry for entry in self.root.iterdir() if entry.stat().st_mtime < cutoff]
        for entry in old:
            shutil.rmtree(entry, ignore_errors=True)
        return len(old)

    def close(self) -> None:
        self._directory.cleanup()
