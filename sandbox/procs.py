"""Cell processes seen through /proc, and killing them: the one piece both sides of the sandbox use.

The zygote sweeps a slot's uid after each call and lists cell processes for `ps`; on the host, tests and
benchmarks use `cell_processes` to check that no cell process outlived its pool. Standard library only, so
importing it on the host pulls in nothing that runs inside the sandbox.
"""

from __future__ import annotations

import os
import signal


def cell_processes(uid_base: int, count: int) -> list[tuple[int, int, str]]:
    """(pid, uid, state letter) of processes whose real uid is in [uid_base, uid_base + count).

    Reads /proc/PID/status: the owner of /proc/PID itself turns to root once a process has changed uid (it
    is no longer dumpable), so stat() would miss exactly the processes we look for.
    """
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as fh:
                status = fh.read()
            uid = int(_field(status, b"\nUid:"))
            if uid_base <= uid < uid_base + count:
                found.append((int(name), uid, _field(status, b"\nState:").decode()))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _field(status: bytes, key: bytes) -> bytes:
    """The first word after `key` in a /proc status file (the zygote scans after every cell: no line loop)."""
    start = status.index(key) + len(key)
    return status[start:status.index(b"\n", start)].split(None, 1)[0]


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_uid(uid: int) -> None:
    for pid, _, _ in cell_processes(uid, 1):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
