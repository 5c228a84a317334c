"""Helpers for tests that start rstar as a user would: a free port, waiting until a process serves, and
clearing what a killed engine leaves in shared memory."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(process: subprocess.Popen, url: str, log_path: Path, timeout_s: float) -> None:
    """Poll `url` until it answers 200; fail with the process's log if it exits or the time runs out."""
    deadline = time.time() + timeout_s
    while True:
        assert process.poll() is None, f"{process.args} exited: {log_path.read_text()[-3000:]}"
        assert time.time() < deadline, f"{url} did not answer in {timeout_s:.0f} s: {log_path.read_text()[-3000:]}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def remove_orphaned_shared_memory(since: float) -> list[str]:
    """Unlink the POSIX shared-memory segments vLLM made (/dev/shm/psm_*) since `since` (a time.time()) that no
    live process maps or holds open: what a SIGKILLed engine leaves behind. They are RAM (tmpfs) until unlinked,
    so a suite that kills engines on purpose would otherwise shrink the memory of every later run on the machine."""
    shm = Path("/dev/shm")
    candidates = {p.name for p in shm.glob("psm_*") if p.stat().st_mtime >= since}
    if not candidates:
        return []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                candidates -= {line.rsplit("/dev/shm/", 1)[1].split()[0] for line in maps if "/dev/shm/psm_" in line}
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        for fd in fds:
            with contextlib.suppress(OSError):  # closed meanwhile
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/psm_"):
                    candidates.discard(target.removeprefix("/dev/shm/").split()[0])
    for name in candidates:
        (shm / name).unlink(missing_ok=True)
    return sorted(candidates)
