"""Cell processes seen through /proc, and killing them: the one piece both sides of the sandbox use.

The zygote kills what a cell left (its process group, and without seccomp its uid) and lists cell processes
for `ps`; on the host, tests and benchmarks use `cell_processes` to check that no cell process outlived its
pool. Standard library only, so
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
        _kill(pid)


def process_group(pid: int) -> int | None:
    """The process group of `pid` (the field after state and ppid in /proc/PID/stat), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[2])  # comm, in parentheses, may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def kill_strays(uid_base: int, count: int, groups: set[int]) -> list[int]:
    """Kill every process with a uid in [uid_base, uid_base + count) outside the process groups `groups`;
    returns their pids."""
    strays = [pid for pid, _, _ in cell_processes(uid_base, count) if process_group(pid) not in groups]
    for pid in strays:
        _kill(pid)
    return strays


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
