"""The forker: the one process that holds the warm image (the preloads) and forks cells from it.

Why a process of its own: after a fork, every page the parent writes while a child still maps it is copied,
and the forking process always has spares alive. The zygote's event loop (frames, jobs, selectors, answers)
writes a lot; run in the process that forks, all of it would be copied again after every fork, and every fork
(page-table copying) would hold up the answers due meanwhile. So the zygote starts this process before it
imports anything heavy; the forker preloads, and its loop does little but fork, in parallel with the zygote.

For each spawn request it forks a child (`child.fork_child`: hardened, waiting for a job), passes the parent's
ends of the child's pipes to the zygote over a unix socket (SCM_RIGHTS) and closes its own copies, so it holds
no pipe of any cell. It is the cells' parent and the subreaper of everything they start: it reaps them and
reports each exit status. Everything else (scheduling, deadlines, output, killing) stays the zygote's.

Messages, one SOCK_SEQPACKET record each. The per-cell ones are packed structs, not JSON: everything the
forker's loop touches after a fork is copied, and json's encoder touches a lot.
    zygote -> forker  SPAWN (tag, uid or -1, persistent, cpu_s, room_mb or -1) + the scratch path in UTF-8,
                      then, for a container's cell, NUL and its data dir
    forker -> zygote  READY + JSON {"warmup_s", "released_memory", "huge_page_mb"}     once, when preloaded
                      SPAWNED (tag, pid, born) + fds out, err, job, status
                      EXITED (pid, waitpid status)
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

from . import cell, harden, procs
from .child import Child, ChildSetup, Container, fork_child

PR_SET_CHILD_SUBREAPER = 36
MADV_COLLAPSE = 25  # Linux 6.1+
HUGE_PAGE = 2 << 20
MESSAGE_MAX = 64 * 1024  # a record; ours are a few hundred bytes at most
SPAWN = struct.Struct("=qi?ii")  # tag, uid (-1: keep ours), persistent, cpu_s, room_mb (-1: none); the paths follow
SPAWNED = struct.Struct("=cqid")  # b"S", tag, pid, born (monotonic)
EXITED = struct.Struct("=cii")  # b"E", pid, status
READY = b"R"
CHILD_FDS = struct.Struct("=4i")  # out, err, job, status, as SCM_RIGHTS carries them


class ForkerGone(RuntimeError):
    """The forker's end of the socket closed: it died, and no cell can be started any more."""


# ------------------------------------------------------------------------------------- the zygote's side
@dataclass
class Spawned:
    tag: int
    child: Child


@dataclass
class Exited:
    pid: int
    status: int


class Forker:
    """The zygote's handle on the forker: send spawn requests, receive children and exit statuses."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock, self.pid = sock, pid
        self.tags = iter(range(1, 1 << 62))
        self.asked: dict[int, tuple[int | None, str, Container | None]] = {}  # tag -> what a child not yet received was asked with

    @classmethod
    def start(cls, cfg: dict) -> tuple["Forker", dict]:
        """Fork the forker (before this process imports the preloads), wait for it to preload; returns the
        handle and its ready message."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                ours.close()
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)  # the zygote's control pipe is the zygote's alone: its EOF must not wait for us
                os.dup2(devnull, 1)
                os.close(devnull)
                serve(theirs, cfg)
                code = 0
            finally:
                os._exit(code)
        theirs.close()
        forker = cls(ours, pid)
        ready = forker._receive(block=True)
        if not isinstance(ready, dict):
            raise RuntimeError(f"the forker sent {ready!r} instead of its ready message")
        return forker, ready

    def fileno(self) -> int:
        return self.sock.fileno()

    def request(self, uid: int | None, scratch: str, persistent: bool, cpu_s: int, container: Container | None = None) -> int:
        """Ask for a child; returns the tag its `Spawned` will carry."""
        tag = next(self.tags)
        room_mb, paths = (-1, scratch) if container is None else (-1 if container.room_mb is None else container.room_mb, f"{scratch}\0{container.data_dir}")
        message = SPAWN.pack(tag, -1 if uid is None else uid, persistent, cpu_s, room_mb) + paths.encode()
        try:
            self.sock.send(message)  # blocking, but small, and the forker always reads
        except OSError as exc:
            raise ForkerGone(f"the forker is gone: {exc}") from exc
        self.asked[tag] = (uid, scratch, container)
        return tag

    def pending(self) -> list[Spawned | Exited]:
        """Every message waiting now, without blocking."""
        messages = []
        while (message := self._receive(block=False)) is not None:
            messages.append(message)
        return messages

    def wait(self) -> list[Spawned | Exited]:
        """Block until the forker says something; returns that and whatever else is waiting."""
        return [self._receive(block=True), *self.pending()]

    def _receive(self, block: bool) -> Spawned | Exited | dict | None:
        """The next message (None: nothing waiting). Anything unreadable is logged and skipped: a child whose
        hardening failed before it moved its fds into place reports on the fd the forker's socket had."""
        flags = socket.MSG_CMSG_CLOEXEC | (0 if block else socket.MSG_DONTWAIT)
        while True:
            try:
                # socket.recv_fds would do, but it drops its flags argument (CPython 3.11), so it always blocks
                data, ancillary, _, _ = self.sock.recvmsg(MESSAGE_MAX, socket.CMSG_SPACE(CHILD_FDS.size), flags)
            except BlockingIOError:
                return None
            except OSError as exc:
                raise ForkerGone(f"the forker is gone: {exc}") from exc
            if not data:
                raise ForkerGone("the forker exited")
            if data[:1] == b"E" and len(data) == EXITED.size:
                _, pid, status = EXITED.unpack(data)
                return Exited(pid, status)
            if data[:1] == b"S" and len(data) == SPAWNED.size and ancillary:
                _, tag, pid, born = SPAWNED.unpack(data)
                out, err, job, status = CHILD_FDS.unpack(ancillary[0][2])
                uid, scratch, container = self.asked.pop(tag)
                return Spawned(tag, Child(pid, uid, scratch, out, err, job, status, born, container))
            if data[:1] == READY:
                return json.loads(data[1:])
            print(f"ignored an unreadable message on the forker's socket: {data[:200]!r}", file=sys.stderr)

    def close(self) -> None:
        """End the forker (it kills any cell it still has) and collect its exit."""
        self.sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


# ---------------------------------------------------------------------------------- in the forker itself
def serve(sock: socket.socket, cfg: dict) -> None:
    """The forker's life: preload, report, then fork on request and report exits until the zygote hangs up."""
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # What a cell inherits, set once here so no child spends its first moments (each one copying pages) on it:
    # the cell environment (the BLAS thread counts in it must be set before numpy loads), and python3's signal
    # dispositions for a program's own subprocesses, SIGPIPE and SIGINT at their defaults (our sends say
    # MSG_NOSIGNAL). The one handler it keeps, SIGCHLD's, each child resets (`child._child_main`).
    os.environ.clear()
    os.environ.update(cfg["env"])
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    setup = ChildSetup.from_config(cfg)
    started = time.monotonic()
    # matplotlib builds its font list when it loads, asking fontconfig (which scans every font again and again
    # without a writable cache): both get a cache dir of the warm image's own, beside the scratch dirs, which no
    # cell reads (the fonts are in memory by then). Cells get the cell environment.
    cache = {"MPLCONFIGDIR": os.path.join(cfg["scratch_root"], ".matplotlib"), "XDG_CACHE_HOME": os.path.join(cfg["scratch_root"], ".cache")}
    os.environ.update(cache)
    cell.preload(cfg.get("preload", []))
    for name in cache:
        os.environ.pop(name, None)
    from . import verify  # noqa: F401  # so answer checking pays no import either

    released_memory = measure_released_headroom(setup)
    gc.collect()
    gc.freeze()  # keeps the forked children from dirtying (copying) every page during a collection
    huge = collapse_into_huge_pages()
    ready = {"warmup_s": round(time.monotonic() - started, 3), "released_memory": released_memory, "huge_page_mb": huge >> 20}
    _send(sock, READY + json.dumps(ready).encode())

    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the signal reaches the wake-up fd
    signal.set_wakeup_fd(wake_w)
    children: set[int] = set()  # pids of the children not reaped yet
    # Kept small on purpose: each page this loop writes is copied once per fork (the spares still map it).
    while True:
        readable, _, _ = select.select((sock, wake_r), (), ())
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            _report_exits(sock, children)
        if sock not in readable:
            continue
        request = sock.recv(MESSAGE_MAX)
        if not request:  # the zygote is gone: take its cells with it
            for pid in children:
                procs.kill_group(pid)
            return
        tag, uid, persistent, cpu_s, room_mb = SPAWN.unpack_from(request)
        scratch, _, data_dir = request[SPAWN.size :].decode().partition("\0")
        container = Container(data_dir, None if room_mb < 0 else room_mb) if data_dir else None
        child = fork_child(setup, None if uid < 0 else uid, scratch, persistent, cpu_s, time.monotonic(), container)
        children.add(child.pid)
        with contextlib.suppress(OSError):  # the zygote is gone: the next recv says so
            sock.sendmsg((SPAWNED.pack(b"S", tag, child.pid, child.born),),
                         ((socket.SOL_SOCKET, socket.SCM_RIGHTS, CHILD_FDS.pack(*child.fds())),), socket.MSG_NOSIGNAL)
        for fd in child.fds():
            os.close(fd)


def _report_exits(sock: socket.socket, children: set[int]) -> None:
    """Reap every child that has exited, and the orphans this subreaper inherited (the zygote ignores those)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send(sock, EXITED.pack(b"E", pid, status))


def _send(sock: socket.socket, message: bytes) -> None:
    with contextlib.suppress(OSError):  # the zygote is gone: the next recv says so
        sock.send(message, socket.MSG_NOSIGNAL)


def collapse_into_huge_pages() -> int:
    """Back the warm image's anonymous memory (the heap the preloads built) with 2 MB pages; returns the bytes
    now in them.

    A fork copies one page-table entry per 4 KB page and a cell's exit frees them again; a huge page is one
    entry. Copy-on-write stays at 4 KB (the kernel splits a huge page a child writes to), so the pages a cell
    dirties cost what they did. MADV_COLLAPSE (Linux 6.1) does this now and whatever the system's THP setting;
    on older kernels, or ranges it refuses (empty reservations), nothing changes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    collapsed = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            perms, inode, name = fields[1], fields[4], fields[5] if len(fields) > 5 else ""
            if not perms.startswith("rw") or inode != "0" or name not in ("", "[heap]"):
                continue  # files, stacks and the kernel's own mappings stay as they are
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            first, last = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
            if last > first and libc.madvise(first, last - first, MADV_COLLAPSE) == 0:
                collapsed += last - first
    return collapsed


def measure_released_headroom(setup: ChildSetup) -> str:
    """Set the room code-judge gave a program (see child._enter_released_semantics); returns the /health note."""
    try:
        fresh = harden.fresh_python_address_space(sys.executable)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"released protocol: no code-judge memory cap (fresh python3 not measured: {exc})"
    setup.released_headroom = harden.CODE_JUDGE_ADDRESS_SPACE - fresh
    return (f"released protocol: {setup.released_headroom / 2**20:.0f} MB of address space above the preloaded "
            f"image (code-judge's 384 MB minus a fresh python3's {fresh / 2**20:.0f} MB)")
