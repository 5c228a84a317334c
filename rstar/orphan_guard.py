"""Nothing an rstar process starts outlives it, however that process ends.

vLLM's engine processes (EngineCore and its workers) do not watch their parent: a `rstar serve` or `rstar rl
train` killed outright (the OOM killer, kill -9) leaves them running, holding the model and its KV cache.
`guard_this_process()` starts, once per process, a small guard process. The guard notes every POLL_S which
processes run under its owner and waits on a pidfd for the owner to end; then it SIGKILLs each process it saw
there that is still the same process (same start time, since pids are reused). A process stays on that list when
it leaves the owner's tree while it runs: its parent ended and it went to init, or the owner's own exit moved it
there a moment before the pidfd said so. A process started in the owner's last POLL_S is missed. Then it unlinks
the POSIX shared memory (/dev/shm/psm_*) the killed processes had and no other process uses: vLLM's engine makes
segments of hundreds of MB there, RAM until unlinked. It says on stderr what it killed and how long that took.

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


def stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name, or None when there is no such process. By proc(5)'s
    numbering less 3: [0] state, [1] parent pid, [7] minor faults, [8] those of reaped children, [11:13] user
    and system time, [13:15] those of reaped children, [19] start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()  # the command name may hold spaces and parentheses
    except OSError:
        return None


def process_table() -> dict[int, list[bytes]]:
    """pid -> stat fields of every process there is."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := stat_fields(name)) is not None:
            table[int(name)] = fields
    return table


def descendants(root: int, table: dict[int, list[bytes]] | None = None) -> list[int]:
    """Every process under `root` (not `root` itself), from `table` or a fresh one."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, fields in table.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot), or None when there is no such process."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has: it holds no memory any more)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in (b"Z", b"X")


def pid_alive(pid: int) -> bool:
    """Whether a process of this host (and pid namespace) has this pid; another user's counts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        return not running(owner) or start_time(owner) != born  # a killed owner stays a zombie until reaped

    seen: dict[int, int] = {}
    while not owner_ended():
        seen = still_seen(seen, owner, process_table())
    killing = time.monotonic()
    segments = {name for name in shared_memory_used(seen) if name.startswith(SEGMENT_PREFIX)}
    killed = kill_if_unchanged(seen)
    deadline = killing + EXIT_WAIT_S
    while (left := [pid for pid in killed if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    unlinked = unlink_unused_shared_memory(segments)
    if killed:
        print(f"rstar orphan guard: process {owner} ended; killed what it left: {len(killed)} process{'es' * (len(killed) > 1)}"
              f" ({f'{left} still running' if left else 'all gone'} after {time.monotonic() - killing:.1f} s),"
              f" unlinked {len(unlinked)} shared-memory segments", file=sys.stderr, flush=True)


def still_seen(seen: dict[int, int], owner: int, table: dict[int, list[bytes]]) -> dict[int, int]:
    """pid -> start time of every process under `owner` in `table`, and of those in `seen` still running as the
    same process wherever they are now."""
    kept = {pid: started for pid, started in seen.items() if pid in table and int(table[pid][19]) == started}
    return kept | {pid: int(table[pid][19]) for pid in descendants(owner, table) if pid != os.getpid()}


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
