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
                fields = dict(line.split(b":", 1) for line in fh if line[:4] in (b"Uid:", b"Stat"))
            uid = int(fields[b"Uid"].split()[0])
            if uid_base <= uid < uid_base + count:
                found.append((int(name), uid, fields[b"State"].split()[0].decode()))
        except (OSError, ValueError, IndexError, KeyError):
            continue
    return found


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
