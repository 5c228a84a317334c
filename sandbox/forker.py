"""The forker: the one process that holds the warm image (the preloads) and forks cells from it.

Why a process of its own: after a fork, every page the parent writes while a child still maps it is copied.
A zygote that forked its cells itself kept a spare alive per slot, so its whole event loop (frames, jobs,
selectors, answers) wrote to shared pages: about 300 copy-on-write faults per call, a few microseconds each.
And each fork (1-2 ms of page-table copying) held up any answer due meanwhile. The zygote now starts this
process before it imports anything heavy; the forker preloads, and its loop does little but fork, so little is
copied, and it forks in parallel with the zygote's answering.

For each spawn request it forks a child (`child.fork_child`: hardened, waiting for a job), passes the parent's
ends of the child's pipes to the zygote over a unix socket (SCM_RIGHTS) and closes its own copies, so it holds
no pipe of any cell. It is the cells' parent and the subreaper of everything they start: it reaps them and
reports each exit status. Everything else (scheduling, deadlines, output, killing) stays the zygote's.

Messages, one JSON object per SOCK_SEQPACKET record:
    zygote -> forker  {"op": "spawn", "tag": int, "uid": int | null, "scratch": path, "persistent": bool, "cpu_s": int}
    forker -> zygote  {"op": "ready", "warmup_s": float, "released_memory": str}    once, when preloaded
                      {"op": "spawned", "tag", "pid", "uid", "scratch", "born"}     + fds: out, err, job, status
                      {"op": "exited", "pid": int, "status": int}                    a waitpid status
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from . import cell, harden, procs
from .child import Child, ChildSetup, fork_child

PR_SET_CHILD_SUBREAPER = 36
MESSAGE_MAX = 64 * 1024  # a record's JSON; ours are a few hundred bytes
CHILD_FDS = 4  # out, err, job, status
FD_SIZE = array.array("i").itemsize


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
        if not isinstance(ready, dict) or ready.get("op") != "ready":
            raise RuntimeError(f"the forker sent {ready!r} instead of its ready message")
        return forker, ready

    def fileno(self) -> int:
        return self.sock.fileno()

    def request(self, uid: int | None, scratch: str, persistent: bool, cpu_s: int) -> int:
        """Ask for a child; returns the tag its `Spawned` will carry."""
        tag = next(self.tags)
        message = {"op": "spawn", "tag": tag, "uid": uid, "scratch": scratch, "persistent": persistent, "cpu_s": cpu_s}
        try:
            self.sock.send(json.dumps(message).encode())  # blocking, but small, and the forker always reads
        except OSError as exc:
            raise ForkerGone(f"the forker is gone: {exc}") from exc
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
        flags = socket.MSG_CMSG_CLOEXEC | (0 if block else socket.MSG_DONTWAIT)
        try:
            # socket.recv_fds would do, but it drops its flags argument (CPython 3.11), so it always blocks
            data, ancillary, _, _ = self.sock.recvmsg(MESSAGE_MAX, socket.CMSG_SPACE(CHILD_FDS * FD_SIZE), flags)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise ForkerGone(f"the forker is gone: {exc}") from exc
        fds = array.array("i")
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % FD_SIZE])
        if not data:
            raise ForkerGone("the forker exited")
        message = json.loads(data)
        op = message.get("op")
        if op == "exited":
            return Exited(message["pid"], message["status"])
        if op == "spawned":
            out, err, job, status = fds
            child = Child(message["pid"], message["uid"], message["scratch"], out, err, job, status, message["born"])
            return Spawned(message["tag"], child)
        for fd in fds:
            os.close(fd)
        return message

    def close(self) -> None:
        """End the forker (it kills any cell it still has) and collect its exit."""
        self.sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


# ---------------------------------------------------------------------------------- in the forker itself
def serve(sock: socket.socket, cfg: dict) -> None:
    """The forker's life: preload, report, then fork on request and report exits until the zygote hangs up."""
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    setup = ChildSetup.from_config(cfg)
    started = time.monotonic()
    cell.preload(cfg.get("preload", []))
    from . import verify  # noqa: F401  # so answer checking pays no import either

    released_memory = measure_released_headroom(setup)
    gc.collect()
    gc.freeze()  # keeps the forked children from dirtying (copying) every page during a collection
    _send(sock, {"op": "ready", "warmup_s": round(time.monotonic() - started, 3), "released_memory": released_memory})

    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    children: set[int] = set()
    while True:
        for key, _ in selector.select():
            if key.fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _report_exits(sock, children)
                continue
            data = sock.recv(MESSAGE_MAX)
            if not data:  # the zygote is gone: take its cells with it
                for pid in children:
                    procs.kill_group(pid)
                return
            request = json.loads(data)
            child = fork_child(setup, request["uid"], request["scratch"], request["persistent"], request["cpu_s"], time.monotonic())
            children.add(child.pid)
            reply = {"op": "spawned", "tag": request["tag"], "pid": child.pid, "uid": child.uid, "scratch": child.scratch, "born": child.born}
            socket.send_fds(sock, [json.dumps(reply).encode()], list(child.fds()))
            for fd in child.fds():
                os.close(fd)


def _report_exits(sock: socket.socket, children: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send(sock, {"op": "exited", "pid": pid, "status": status})  # orphans it inherited too: the zygote ignores them


def _send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def measure_released_headroom(setup: ChildSetup) -> str:
    """Set the room code-judge gave a program (see child._enter_released_semantics); returns the /health note."""
    try:
        fresh = harden.fresh_python_address_space(sys.executable)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"released protocol: no code-judge memory cap (fresh python3 not measured: {exc})"
    setup.released_headroom = harden.CODE_JUDGE_ADDRESS_SPACE - fresh
    return (f"released protocol: {setup.released_headroom / 2**20:.0f} MB of address space above the preloaded "
            f"image (code-judge's 384 MB minus a fresh python3's {fresh / 2**20:.0f} MB)")
