"""Temp directories that outlive a killed process only until the next one of their kind starts.

A process removes its own temp directories when it stops, but not when it is killed (SIGKILL, the OOM killer,
ray.kill on an actor). Each directory here is named for the process that made it (`<prefix><pid>-<random>`),
and making one first removes the directories of that prefix whose process is gone. A directory of another
user, or whose pid is alive (even if reused), is left alone. Users: the engine's sockets, the UI's downloads,
the unsafe sandbox's scratch, the weights an RL trainer hands its engine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from rstar.orphan_guard import pid_alive


def owned_temp_dir(prefix: str, root: Path | None = None) -> tempfile.TemporaryDirectory:
    """A new directory in `root` (default: the temp dir) named for this process, after removing `prefix`'s orphans."""
    remove_orphans(prefix, root)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-", dir=root, ignore_cleanup_errors=True)


def remove_orphans(prefix: str, root: Path | None = None) -> list[Path]:
    """Remove the directories `<prefix><pid>-*` in `root` (default: the temp dir) whose process has ended; the
    removed ones."""
    removed = []
    for entry in Path(root or tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = entry.name[len(prefix):].partition("-")[0]
        try:
            owned = entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid()
        except OSError:  # removed meanwhile
            continue
        if owned and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
