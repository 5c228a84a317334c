"""Temp directories that outlive a killed process only until the next one of their kind starts.

A process removes its own temp directories when it stops, but not when it is killed (SIGKILL, the OOM killer,
ray.kill on an actor, a Ctrl-C that ends in a re-raised signal). Each directory here is named for the process
that made it (`<prefix><pid>-<random>`), and making one first removes the directories of that prefix whose
process is gone. A directory of another user, or whose pid is alive (even if reused), is left alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def owned_temp_dir(prefix: str) -> tempfile.TemporaryDirectory:
    """A new temp directory named for this process, after removing `prefix`'s orphans."""
    remove_orphans(prefix)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-", ignore_cleanup_errors=True)


def remove_orphans(prefix: str, root: str | Path | None = None) -> list[Path]:
    """Remove the directories `<prefix><pid>-*` in the temp dir whose process has ended; the removed ones."""
    removed = []
    for entry in Path(root or tempfile.gettempdir()).glob(f"{prefix}*"):
        pid = entry.name[len(prefix):].partition("-")[0]
        try:
            owned = entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid()
        except OSError:  # removed meanwhile
            continue
        if owned and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
