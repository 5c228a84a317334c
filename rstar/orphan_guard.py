"""Nothing an rstar process starts outlives it, however that process ends.

vLLM's engine processes (EngineCore and its workers) do not watch their parent: a `rstar serve` or `rstar rl
train` killed outright (the OOM killer, kill -9) leaves them running, holding the model and its KV cache.
`guard_this_process()` starts, once per process, a small guard process. The guard notes every POLL_S which
processes run under its owner and waits on a pidfd for the owner to end; then it SIGKILLs each process it last
saw there that is still the same process (same start time, since pids are reused). A process started in the
owner's last POLL_S is missed. Then it unlinks the POSIX shared memory (/dev/shm/psm_*) the killed processes had
and no other process uses: vLLM's engine makes segments of hundreds of MB there, RAM until unlinked.

The guard watches a pidfd rather than a pipe from its owner: vLLM forks its engine processes, and a forked child
keeps every fd, so a pipe's write end would stay open in the very processes the guard is for.

    python -m rstar.orphan_guard OWNER_PID     (what guard_this_process starts)
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

POLL_S = 1.0
EXIT_WAIT_S = 10.0  # how long the guard waits for the processes it killed to be gone before clearing their memory
SHM = "/dev/shm/"
SEGMENT_PREFIX = "psm_"  # multiprocessing.shared_memory's names, which vLLM's engine uses

_guard: subprocess.Popen | None = None


def guard_this_process() -> None:
    """Start this process's guard, unless it has one."""
    global _guard
    if (_guard is not None and _guard.poll() is None) or not os.path.isdir("/proc/self"):
        return  # guarded already, or not Linux: nothing to read the process tree from
    # Its own session: a Ctrl-C to the terminal's process group must not end the guard before its owner.
    _guard = subprocess.Popen([sys.executable, "-m", "rstar.orphan_guard", str(os.getpid())], stdin=subprocess.DEVNULL,
                              start_new_session=True)


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has: it holds no memory any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def shared_memory_used(pids: Iterable[int] | None = None) -> set[str]:
    """Names of the /dev/shm files these processes (every process, when None) map or hold open."""
    names: set[str] = set()
    for pid in pids if pids is not None else filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                names |= {line.split(SHM, 1)[1].split()[0] for line in maps if SHM in line}
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        for fd in fds:
            with contextlib.suppress(OSError):  # closed meanwhile
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(SHM):
                    names.add(target.removeprefix(SHM).split()[0])
    return names


def unlink_unused_shared_memory(names: Iterable[str]) -> list[str]:
    """Unlink those of `names` that no live process maps or holds open; returns the ones unlinked."""
    unused = {name for name in names if "/" not in name} - shared_memory_used()  # files of /dev/shm itself only
    for name in unused:
        with contextlib.suppress(OSError):  # gone meanwhile
            os.unlink(SHM + name)
    return sorted(unused)


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every process under `root` (not `root` itself)."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
        started[int(name)] = int(fields[19])
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = started[pid]
        todo.extend(children.get(pid, []))
    return found


def watch(owner: int) -> None:
    """The guard's life: note the owner's descendants until the owner ends, then kill what is left of them."""
    born = start_time(owner)
    try:
        owner_gone = os.pidfd_open(owner)
    except ProcessLookupError:
        return
    except OSError:  # a kernel before 5.3: look every POLL_S instead
        owner_gone = None

    def owner_ended() -> bool:
        if owner_gone is not None:
            return bool(select.select([owner_gone], [], [], POLL_S)[0])
        time.sleep(POLL_S)
        return start_time(owner) != born

    seen: dict[int, int] = {}
    while not owner_ended():
        seen = {pid: started for pid, started in descendants(owner).items() if pid != os.getpid()}
    segments = {name for name in shared_memory_used(seen) if name.startswith(SEGMENT_PREFIX)}
    killed = kill_if_unchanged(seen)
    deadline = time.monotonic() + EXIT_WAIT_S
    while any(running(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    unlink_unused_shared_memory(segments)


def kill_if_unchanged(seen: dict[int, int]) -> list[int]:
    """SIGKILL each pid whose process still has the start time seen; returns the pids killed."""
    killed = []
    for pid, started in seen.items():
        if start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


if __name__ == "__main__":
    watch(int(sys.argv[1]))
