"""The warm zygote: one long-lived interpreter with the heavy libraries imported, forking hardened children.

It runs inside bubblewrap (see `launch.py`) and talks to the pool over its stdin/stdout with `protocol`
frames. It is single-threaded on purpose: forking a threaded process is unsafe.

Per worker slot it keeps one *spare*: a child forked ahead of time that has already entered its own session,
set its rlimits, dropped to the slot's uid and loaded Landlock and seccomp, and now blocks reading its job
pipe. A call therefore costs one pipe write plus the cell itself. The zygote reads the child's stdout and
stderr as they come (a byte cap stops a flood), enforces the wall deadline, and answers as soon as the child
reports done; killing the process group, sweeping the uid, wiping the scratch dir and forking the next
spare happen after the answer is sent.

Sessions (chat mode) are children that loop over jobs and keep their globals, one uid each, expired after
an idle TTL.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time

from . import cell, harden, protocol

PR_SET_CHILD_SUBREAPER = 36
PR_GET_NO_NEW_PRIVS = 39
PR_GET_SECCOMP = 21
STATUS_MAX = 64 * 1024
READ_CHUNK = 65536
RELEASED_DEADLINE_GRACE_S = 1.0
IDLE_CLEAN_S = 0.001  # idle this long with nothing running: time to fork the next spare
MAX_DIRTY_S = 0.05  # under constant load a used slot still gets its spare back within this
CONTROL_IN, CONTROL_OUT = 0, 1
# Fixed fd layout inside every child.
CHILD_STDIN, CHILD_STDOUT, CHILD_STDERR, CHILD_JOB, CHILD_STATUS = 0, 1, 2, 3, 4


# ------------------------------------------------------------------------------------------ child side
class _ChildSetupError(Exception):
    pass


def _place_fds(targets: dict[int, int]) -> None:
    """dup2 each source onto its target fd, then close everything above the fixed layout.

    Sources are first moved above the targets so no dup2 overwrites a source still needed.
    """
    high = {target: fcntl.fcntl(src, fcntl.F_DUPFD, 10) for target, src in targets.items()}
    for target, src in high.items():
        os.dup2(src, target, inheritable=True)
    os.closerange(CHILD_STATUS + 1, 1 << 20)


def _child_main(z: "Zygote", ends: dict[int, int], uid: int | None, scratch: str, persistent: bool, cpu_s: int) -> None:
    """Body of a forked child; never returns."""
    code = 70
    try:
        try:
            # Measured before hardening: Landlock then hides /proc. The few objects a job adds are noise.
            z.child_address_space = harden.address_space()
            os.setsid()
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            devnull = os.open(os.devnull, os.O_RDWR)
            _place_fds({CHILD_STDIN: devnull, **ends})
            layers = z.harden_child(uid, scratch, cpu_s)
        except BaseException as exc:  # noqa: BLE001 - reported to the zygote, then the child exits
            _send_status({"status": "internal_error", "detail": f"hardening failed: {type(exc).__name__}: {exc}"})
            raise _ChildSetupError from exc
        _serve_jobs(z, persistent, layers)
        code = 0
    finally:
        os._exit(code)


def _send_status(message: dict) -> None:
    try:
        os.write(CHILD_STATUS, (json.dumps(message) + "\n").encode())
    except OSError:
        pass


def _fresh_stdio() -> None:
    # New text streams on fds 0-2; the zygote's own sys.std* objects stay referenced by sys.__std*__ and
    # must not be closed (they point at the same fd numbers).
    sys.stdin = open(CHILD_STDIN, "r", encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(CHILD_STDOUT, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
    sys.stderr = open(CHILD_STDERR, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)


def _set_stdin(text: str | None) -> None:
    """Give the cell a real fd 0 holding `text` (a memfd: seekable, no writer to deadlock with)."""
    if text is None:
        return
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    data = text.encode("utf-8", "surrogateescape")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, CHILD_STDIN)
    os.close(fd)
    sys.stdin = open(CHILD_STDIN, "r", encoding="utf-8", errors="replace", closefd=False)


def _serve_jobs(z: "Zygote", persistent: bool, layers: dict) -> None:
    _fresh_stdio()
    namespace = cell.new_namespace()
    while True:
        job = protocol.read_frame(CHILD_JOB)
        if job is None:
            return
        kind = job.get("kind")
        if not persistent:
            harden.lower_cpu_limit(int(job.get("cpu_s", 1)))
        message: dict
        if kind == "exec":
            released = job.get("protocol") == "released"
            if released:
                _enter_released_semantics(z, float(job["timeout_s"]))
            _set_stdin(job.get("stdin"))
            cell.replay(job.get("history") or [], namespace)
            run = cell.run_cell_released if released else cell.run_cell
            status, exit_code = run(job["code"], namespace)
            message = {"status": status, "exit_code": exit_code}
        elif kind == "verify":
            from . import verify

            message = {"status": "ok", "exit_code": 0, "value": verify.score(job["response"], job["gold"])}
        elif kind == "probe":
            message = {"status": "ok", "exit_code": 0, "value": _probe_self(layers)}
        else:
            message = {"status": "invalid_input", "exit_code": None}
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - the cell may have closed it
                pass
        _send_status(message)
        if not persistent:
            return


def _enter_released_semantics(z: "Zygote", timeout_s: float) -> None:
    """What a code-judge process running rStar2-Agent's wrapper has that our cells do not:

    - stdout buffered as python3 buffers a pipe, so what is still buffered when an exception escapes is
      lost (cell.run_cell_released drops it);
    - a timer that, at the wall limit, prints 'Suicide from timeout.' (flushing what was buffered) and
      ends the process; the zygote's own deadline then comes one second later, as code-judge's worker
      gave its subprocess one second more;
    - the address space code-judge left the program: 256 + 128 MB minus what a fresh python3 has mapped
      by then, on top of what this child already maps (the preloaded libraries are free here).
    """
    sys.stdout = open(CHILD_STDOUT, "w", encoding="utf-8", errors="backslashreplace", closefd=False)

    def suicide(*_) -> None:
        print("Suicide from timeout.", flush=True)
        _send_status({"status": "timeout", "exit_code": None})
        os._exit(0)

    signal.signal(signal.SIGALRM, suicide)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    if z.released_headroom is not None:
        harden.cap_address_space(z.child_address_space + z.released_headroom)


def _probe_self(layers: dict) -> dict:
    """What a hardened child can observe about itself; the zygote turns it into the /health report."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
        socket_result = "allowed"
    except OSError as exc:
        socket_result = errno.errorcode.get(exc.errno, str(exc.errno))
    open_fds = []
    for fd in range(64):
        try:
            os.fstat(fd)
            open_fds.append(fd)
        except OSError:
            pass
    try:
        open("/etc/hostname").close()
        host_file = "readable"
    except OSError as exc:
        host_file = errno.errorcode.get(exc.errno, str(exc.errno))
    return {
        "layers": layers,
        "uid": os.getuid(),
        "no_new_privs": libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0),
        "seccomp_mode": libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0),
        "socket": socket_result,
        "open_fds": open_fds,
        "env_keys": sorted(os.environ),
        "etc_hostname": host_file,
    }


# ----------------------------------------------------------------------------------------- zygote side
class Child:
    """A forked child and the zygote's ends of its pipes."""

    def __init__(self, pid: int, uid: int | None, scratch: str, out: int, err: int, job: int, status: int) -> None:
        self.pid, self.uid, self.scratch = pid, uid, scratch
        self.out, self.err, self.job, self.status = out, err, job, status
        self.exit_status: int | None = None  # waitpid status once reaped
        self.born = 0.0

    def fds(self) -> tuple[int, ...]:
        return self.out, self.err, self.job, self.status


class Job:
    def __init__(self, request: dict, child: Child, keep_bytes: int, session: str | None) -> None:
        self.id = request["id"]
        self.request = request
        self.child = child
        self.session = session
        self.started = time.monotonic()
        # code-judge's worker waited one second past the limit for a program whose own timer failed to fire.
        grace = RELEASED_DEADLINE_GRACE_S if request.get("protocol") == "released" else 0.0
        self.deadline = self.started + float(request["timeout_s"]) + grace
        self.out = bytearray()
        self.err = bytearray()
        self.seen = {"out": 0, "err": 0}
        self.keep = keep_bytes
        self.status_buf = bytearray()
        self.status_eof = False
        self.message: dict | None = None
        self.kill_reason: str | None = None
        self.session_new = False


class Session:
    def __init__(self, index: int, child: Child) -> None:
        self.index, self.child = index, child
        self.last_used = time.monotonic()
        self.busy = False


class Zygote:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.slots = int(cfg["slots"])  # uids with a spare each: workers plus a few kept ready
        self.drop_uid = bool(cfg["drop_uid"])
        self.uid_base = int(cfg["uid_base"])
        self.seccomp = bytes.fromhex(cfg["seccomp_bpf"]) if cfg.get("seccomp_bpf") else None
        self.landlock_abi = harden.landlock_abi() if cfg.get("landlock") else 0
        self.sel = selectors.DefaultSelector()
        self.control = protocol.FrameBuffer()
        self.spares: dict[int, Child | None] = {}
        self.busy: dict[int, Job] = {}  # slot -> job
        self.dirty: dict[int, float] = {}  # slot -> when its last child was killed; needs a new spare
        self.jobs_by_fd: dict[int, tuple[Job, str]] = {}
        self.children: dict[int, Child] = {}  # pid -> child, for reaping
        self.killed: set[int] = set()  # children sent SIGKILL and not reaped yet
        self.sessions: dict[str, Session] = {}
        self.session_jobs: dict[str, Job] = {}
        self.free_session_slots = list(range(int(cfg["max_sessions"])))
        self.running = True
        # Room code-judge gave a program's own allocations (see _enter_released_semantics); None when a fresh
        # interpreter could not be measured, reported at /health.
        self.released_headroom: int | None = None
        self.released_memory_note = ""
        self.child_address_space = 0  # set in each child before hardening

    # ------------------------------------------------------------------------------------ set-up
    def preload(self) -> None:
        for name in self.cfg.get("preload", []):
            __import__(name)
        if "sympy" in self.cfg.get("preload", []):
            # sympy builds some caches lazily on first use; pay that once here, not in every cell.
            import sympy

            sympy.Symbol("x") + 1
        from . import verify  # noqa: F401 - so answer checking pays no import either

        gc.collect()
        gc.freeze()  # keeps the forked children from dirtying (copying) every page during a collection

    def measure_released_headroom(self) -> None:
        try:
            fresh = harden.fresh_python_address_space(sys.executable)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            self.released_memory_note = f"released protocol: no code-judge memory cap (fresh python3 not measured: {exc})"
            return
        self.released_headroom = harden.CODE_JUDGE_ADDRESS_SPACE - fresh
        self.released_memory_note = (
            f"released protocol: {self.released_headroom / 2**20:.0f} MB of address space above the preloaded image "
            f"(code-judge's 384 MB minus a fresh python3's {fresh / 2**20:.0f} MB)"
        )

    def slot_uid(self, slot: int) -> int | None:
        return self.uid_base + slot if self.drop_uid else None

    def session_uid(self, index: int) -> int | None:
        return self.uid_base + self.slots + index if self.drop_uid else None

    def harden_child(self, uid: int | None, scratch: str, cpu_s: int) -> dict:
        """Runs in the child. Each layer is applied or the child dies: there is no partial sandbox."""
        cfg = self.cfg
        layers = {}
        layers["rlimits"] = harden.set_rlimits(
            memory_mb=cfg["memory_mb"], cpu_s=cpu_s, file_size_mb=cfg["file_size_mb"],
            open_files=cfg["open_files"], processes=cfg["processes"] if uid is not None else None)
        ruleset = None
        if self.landlock_abi:
            ll = cfg["landlock"]
            ruleset = harden.landlock_prepare(self.landlock_abi, ll["read_only"], [scratch], ll["devices"])
        if uid is not None:
            harden.drop_privileges(uid)
            layers["uid"] = uid
        harden.set_no_new_privs()
        if ruleset is not None:
            harden.landlock_apply(ruleset)
            layers["landlock"] = self.landlock_abi
        if self.seccomp is not None:
            harden.load_seccomp(self.seccomp)
            layers["seccomp"] = True
        os.chdir(scratch)
        os.environ.clear()
        os.environ.update(cfg["env"])
        os.environ.update({"HOME": scratch, "TMPDIR": scratch})
        return layers

    def make_scratch(self, path: str, uid: int | None) -> None:
        if os.path.isdir(path):
            for entry in os.scandir(path):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    try:
                        os.unlink(entry.path)
                    except OSError:
                        pass
        else:
            os.makedirs(path, mode=0o700, exist_ok=True)
        if uid is not None:
            os.chown(path, uid, uid)
        os.chmod(path, 0o700)

    def spawn(self, uid: int | None, scratch: str, persistent: bool, cpu_s: int) -> Child:
        self.make_scratch(scratch, uid)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        job_r, job_w = os.pipe()
        st_r, st_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _child_main(self, {CHILD_STDOUT: out_w, CHILD_STDERR: err_w, CHILD_JOB: job_r, CHILD_STATUS: st_w},
                        uid, scratch, persistent, cpu_s)
        for fd in (out_w, err_w, job_r, st_w):
            os.close(fd)
        for fd in (out_r, err_r, st_r, job_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        child = Child(pid, uid, scratch, out_r, err_r, job_w, st_r)
        child.born = time.monotonic()
        self.children[pid] = child
        return child

    def spawn_spare(self, slot: int) -> None:
        self.spares[slot] = self.spawn(self.slot_uid(slot), f"{self.cfg['scratch_root']}/slot{slot}", False,
                                       int(self.cfg["cpu_s"]))

    def probe(self) -> dict:
        """Run a probe job in a hardened child and describe the layers that are really in force."""
        child = self.spawn(self.slot_uid(0), f"{self.cfg['scratch_root']}/slot0", False, int(self.cfg["cpu_s"]))
        os.set_blocking(child.job, True)
        protocol.write_frame(child.job, {"kind": "probe", "cpu_s": 5})
        os.set_blocking(child.status, True)
        raw = b""
        while not raw.endswith(b"\n"):
            chunk = os.read(child.status, STATUS_MAX)
            if not chunk:
                break
            raw += chunk
        self.destroy(child)
        os.waitpid(child.pid, 0)
        self.children.pop(child.pid, None)
        try:
            message = json.loads(raw or b"{}")
        except ValueError:
            message = {}
        if message.get("status") != "ok":
            return {"error": message.get("detail") or "probe child died before reporting"}
        report = message["value"]
        report["zygote_network"] = _network_check()
        report["landlock_abi_kernel"] = harden.landlock_abi()
        return report

    # ------------------------------------------------------------------------------------- loop
    def serve(self) -> None:
        os.set_blocking(CONTROL_IN, False)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        self.sel.register(CONTROL_IN, selectors.EVENT_READ, "control")
        self.sel.register(wake_r, selectors.EVENT_READ, "sigchld")
        for slot in range(self.slots):
            self.spawn_spare(slot)
        while self.running:
            timeout = min(self.next_timeout(), IDLE_CLEAN_S) if self.dirty else self.next_timeout()
            events = self.sel.select(timeout)
            for key, _ in events:
                if key.data == "control":
                    self.on_control()
                elif key.data == "sigchld":
                    try:
                        os.read(wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self.reap()
                else:
                    self.on_child_fd(key.fd)
            self.reap()
            self.check_deadlines()
            self.maybe_clean(idle=not events)
        for job in list(self.busy.values()) + list(self.session_jobs.values()):
            self.destroy(job.child)
        for session in self.sessions.values():
            self.destroy(session.child)
        for child in self.spares.values():
            if child is not None:
                self.destroy(child)

    def next_timeout(self) -> float:
        now = time.monotonic()
        times = [job.deadline for job in self.all_jobs()]
        ttl = float(self.cfg["session_ttl_s"])
        times += [s.last_used + ttl for s in self.sessions.values() if not s.busy]
        return max(0.0, min(times) - now) if times else 1.0

    def all_jobs(self) -> list[Job]:
        return list(self.busy.values()) + list(self.session_jobs.values())

    def on_control(self) -> None:
        try:
            data = os.read(CONTROL_IN, 1 << 20)
        except BlockingIOError:
            return
        if not data:
            self.running = False
            return
        for message in self.control.feed(data):
            op = message.get("op")
            if op == "run":
                self.start_job(message)
            elif op == "close_session":
                self.close_session(message.get("session"))
            elif op == "ps":
                self.send({"op": "ps", "id": message.get("id"), "processes": self.process_table()})
            elif op == "shutdown":
                self.running = False

    def send(self, message: dict) -> None:
        os.set_blocking(CONTROL_OUT, True)
        protocol.write_frame(CONTROL_OUT, message)

    def start_job(self, request: dict) -> None:
        session_id = request.get("session")
        keep = int(self.cfg["max_output_chars"]) * 4 + 4
        if session_id is None:
            slot = self.pick_slot()
            if slot is None:
                self.send(_result(request["id"], "queue_timeout", stderr="no free worker slot in the zygote"))
                return
            child = self.spares[slot]
            self.spares[slot] = None
            job = Job(request, child, keep, None)
            self.busy[slot] = job
        else:
            session = self.sessions.get(session_id)
            new = session is None
            if session is None:
                session = self.open_session(session_id)
                if session is None:
                    self.send(_result(request["id"], "queue_timeout", stderr="every session slot is busy"))
                    return
            if session.busy:
                self.send(_result(request["id"], "invalid_input", stderr="this session is already running a cell"))
                return
            self.discard_pending_output(session.child)
            session.busy = True
            job = Job(request, session.child, keep, session_id)
            job.session_new = new
            self.session_jobs[session_id] = job
        child = job.child
        for fd, stream in ((child.out, "out"), (child.err, "err"), (child.status, "status")):
            self.sel.register(fd, selectors.EVENT_READ)
            self.jobs_by_fd[fd] = (job, stream)
        payload = {key: request.get(key) for key in ("kind", "code", "history", "stdin", "response", "gold", "protocol", "timeout_s")}
        payload["cpu_s"] = max(1, int(float(request["timeout_s"]) + 1))
        try:
            os.set_blocking(child.job, True)
            protocol.write_frame(child.job, payload)
        except OSError:
            pass  # the child died while hardening; its status message or exit says why

    def pick_slot(self) -> int | None:
        """The free slot whose spare has had the longest to finish hardening; clean one up if none is ready."""
        ready = [s for s in range(self.slots) if s not in self.busy and s not in self.dirty and self.spares.get(s)]
        if ready:
            return min(ready, key=lambda s: self.spares[s].born)
        for slot in range(self.slots):
            if slot not in self.busy:
                self.dirty.pop(slot, None)
                self.spawn_spare(slot)
                return slot
        return None

    def maybe_clean(self, idle: bool) -> None:
        """Fork replacement spares off the critical path: when nothing runs, when no spare is left, or when
        a slot has waited too long. A fork of the warm image costs ~2 ms that no answer should wait for."""
        if not self.dirty:
            return
        now = time.monotonic()
        slot, since = min(self.dirty.items(), key=lambda item: item[1])
        ready = sum(1 for s in range(self.slots) if s not in self.busy and s not in self.dirty and self.spares.get(s))
        if (idle and not self.all_jobs()) or ready == 0 or now - since > MAX_DIRTY_S:
            del self.dirty[slot]
            self.spawn_spare(slot)

    def open_session(self, session_id: str) -> Session | None:
        if not self.free_session_slots:
            idle = [(s.last_used, sid) for sid, s in self.sessions.items() if not s.busy]
            if not idle:
                return None
            self.close_session(min(idle)[1])
        index = self.free_session_slots.pop(0)
        child = self.spawn(self.session_uid(index), f"{self.cfg['scratch_root']}/session{index}", True,
                           int(self.cfg["session_cpu_s"]))
        session = Session(index, child)
        self.sessions[session_id] = session
        return session

    def close_session(self, session_id: str | None) -> None:
        session = self.sessions.pop(session_id, None) if session_id else None
        if session is None:
            return
        job = self.session_jobs.pop(session_id, None)
        if job is not None:
            self.unregister(job)
        self.destroy(session.child)
        self.make_scratch(session.child.scratch, None)
        self.free_session_slots.append(session.index)

    def discard_pending_output(self, child: Child) -> None:
        """Output a session's background threads wrote between cells belongs to no cell."""
        for fd in (child.out, child.err, child.status):
            try:
                while os.read(fd, READ_CHUNK):
                    pass
            except (BlockingIOError, OSError):
                pass

    def on_child_fd(self, fd: int) -> None:
        entry = self.jobs_by_fd.get(fd)
        if entry is None:
            return
        job, stream = entry
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if stream == "status":
            if not data:
                job.status_eof = True
                self.sel.unregister(fd)
                del self.jobs_by_fd[fd]
                if job.child.exit_status is not None:
                    self.finish(job)
                return
            job.status_buf += data[:STATUS_MAX]
            if b"\n" in job.status_buf:
                self.finish(job)
            return
        if not data:
            self.sel.unregister(fd)
            del self.jobs_by_fd[fd]
            return
        self.take_output(job, stream, data)

    def take_output(self, job: Job, stream: str, data: bytes) -> None:
        buf = job.out if stream == "out" else job.err
        job.seen[stream] += len(data)
        if len(buf) < job.keep:
            buf += data[: job.keep - len(buf)]
        if job.seen["out"] + job.seen["err"] > int(self.cfg["max_output_bytes"]) and job.kill_reason is None:
            job.kill_reason = "output_limit"
            self.finish(job)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.killed.discard(pid)
            child = self.children.pop(pid, None)
            if child is None:
                continue  # an orphaned grandchild we inherited as subreaper
            child.exit_status = status
            job = self.job_of(child)
            if job is not None:
                self.finish(job)
                continue
            for slot, spare in list(self.spares.items()):
                if spare is child:
                    # A spare died before getting work (hardening failed?). It is replaced when the slot's
                    # next job arrives, whose result then carries the reason; respawning here could loop.
                    self.close_fds(child)
                    self.spares[slot] = None
            for sid, session in list(self.sessions.items()):
                if session.child is child and not session.busy:
                    self.close_session(sid)

    def job_of(self, child: Child) -> Job | None:
        for job in self.all_jobs():
            if job.child is child:
                return job
        return None

    def check_deadlines(self) -> None:
        now = time.monotonic()
        for job in self.all_jobs():
            if now >= job.deadline and job.kill_reason is None:
                job.kill_reason = "timeout"
                self.finish(job)
        ttl = float(self.cfg["session_ttl_s"])
        for sid, session in list(self.sessions.items()):
            if not session.busy and now - session.last_used > ttl:
                self.close_session(sid)

    # ------------------------------------------------------------------------------- answering
    def finish(self, job: Job) -> None:
        if job.id is None:
            return  # already answered
        child = job.child
        if job.kill_reason is None and job.message is None:
            self.read_status(job)
            if job.message is None and child.exit_status is None and not job.status_eof:
                return  # not done yet
            if job.message is None and child.exit_status is None:
                return  # status closed but the process still runs: wait for its exit or the deadline
        if job.kill_reason is not None:
            _kill_group(child.pid)
        self.drain(job)
        self.send(self.result_of(job))
        job.id = None
        self.teardown(job)

    def read_status(self, job: Job) -> None:
        if b"\n" not in job.status_buf and not job.status_eof:
            try:
                while len(job.status_buf) < STATUS_MAX:
                    data = os.read(job.child.status, READ_CHUNK)
                    if not data:
                        job.status_eof = True
                        break
                    job.status_buf += data
            except (BlockingIOError, OSError):
                pass
        if b"\n" in job.status_buf:
            line = bytes(job.status_buf).split(b"\n", 1)[0]
            try:
                message = json.loads(line)
                job.message = message if isinstance(message, dict) else {"status": "error"}
            except ValueError:
                job.message = {"status": "error", "detail": "unreadable status from the cell process"}

    def drain(self, job: Job) -> None:
        for fd, stream in ((job.child.out, "out"), (job.child.err, "err")):
            try:
                while True:
                    data = os.read(fd, READ_CHUNK)
                    if not data:
                        break
                    buf = job.out if stream == "out" else job.err
                    job.seen[stream] += len(data)
                    if len(buf) < job.keep:
                        buf += data[: job.keep - len(buf)]
                    if job.seen["out"] + job.seen["err"] > int(self.cfg["max_output_bytes"]):
                        break
            except (BlockingIOError, OSError):
                pass

    def result_of(self, job: Job) -> dict:
        max_chars = int(self.cfg["max_output_chars"])
        stdout, out_cut = _clip(job.out, job.seen["out"], max_chars)
        stderr, err_cut = _clip(job.err, job.seen["err"], max_chars)
        exit_code = None
        value = None
        if job.kill_reason is not None:
            status = job.kill_reason
        elif job.message is not None:
            status = job.message.get("status")
            exit_code = job.message.get("exit_code")
            value = job.message.get("value")
            if status not in ("ok", "error", "memory", "timeout", "internal_error", "invalid_input"):
                status = "error"
            if status == "internal_error" and job.message.get("detail"):
                stderr = (stderr + "\n" if stderr else "") + str(job.message["detail"])
            if not isinstance(exit_code, int):
                exit_code = None
        else:
            raw = job.child.exit_status or 0
            if os.WIFSIGNALED(raw):
                sig = os.WTERMSIG(raw)
                exit_code = -sig
                status = "timeout" if sig == signal.SIGXCPU else "error"
            else:
                exit_code = os.WEXITSTATUS(raw)
                status = "ok" if exit_code == 0 else "error"
        result = _result(job.id, status, stdout=stdout, stderr=stderr, exit_code=exit_code)
        result.update(stdout_truncated=out_cut, stderr_truncated=err_cut,
                      duration_s=round(time.monotonic() - job.started, 6))
        if value is not None:
            result["value"] = value
        if job.session is not None:
            result["session_new"] = job.session_new
        return result

    def teardown(self, job: Job) -> None:
        self.unregister(job)
        if job.session is not None:
            self.session_jobs.pop(job.session, None)
            session = self.sessions.get(job.session)
            if session is not None:
                session.busy = False
                session.last_used = time.monotonic()
                if job.kill_reason is not None or job.child.exit_status is not None:
                    self.close_session(job.session)  # its state is gone with the process
            return
        slot = next(s for s, j in self.busy.items() if j is job)
        del self.busy[slot]
        self.destroy(job.child)
        self.dirty[slot] = time.monotonic()

    def unregister(self, job: Job) -> None:
        for fd in (job.child.out, job.child.err, job.child.status):
            if fd in self.jobs_by_fd:
                self.sel.unregister(fd)
                del self.jobs_by_fd[fd]

    def destroy(self, child: Child) -> None:
        """Kill everything the child started. killpg covers its process group (seccomp denies leaving it);
        the uid sweep catches anything that got out anyway (only possible without seccomp)."""
        _kill_group(child.pid)
        if child.uid is not None:
            _kill_uid(child.uid)
        if child.pid in self.children:
            self.killed.add(child.pid)
        self.close_fds(child)

    def close_fds(self, child: Child) -> None:
        for fd in child.fds():
            try:
                if fd in self.jobs_by_fd:
                    self.sel.unregister(fd)
                    del self.jobs_by_fd[fd]
                os.close(fd)
            except OSError:
                pass

    def process_table(self) -> list[dict]:
        """Every process in our pid namespace that runs as a cell uid, for /health and leak tests."""
        roles = {}
        for slot, child in self.spares.items():
            if child is not None:
                roles[child.pid] = "spare"
        for job in self.busy.values():
            roles[job.child.pid] = "running"
        for sid, session in self.sessions.items():
            roles[session.child.pid] = "session"
        table = []
        for pid, uid, state in cell_processes(self.uid_base, self.slots + int(self.cfg["max_sessions"])):
            role = "exiting" if state in ("Z", "X") or pid in self.killed else roles.get(pid, "stray")
            table.append({"pid": pid, "uid": uid, "role": role})
        if not self.drop_uid:  # no uids to look for: list what we track
            table = [{"pid": pid, "uid": None, "role": role} for pid, role in roles.items()]
        return table


def _clip(data: bytearray, seen: int, max_chars: int) -> tuple[str, bool]:
    text = bytes(data).decode("utf-8", "replace")
    cut = seen > len(data)
    if max_chars >= 0 and len(text) > max_chars:
        text, cut = text[:max_chars], True
    return text, cut


def _result(job_id, status: str, *, stdout: str = "", stderr: str = "", exit_code: int | None = None) -> dict:
    return {"id": job_id, "status": status, "exit_code": exit_code, "stdout": stdout, "stderr": stderr,
            "stdout_truncated": False, "stderr_truncated": False, "duration_s": 0.0}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def cell_processes(uid_base: int, count: int) -> list[tuple[int, int, str]]:
    """(pid, uid, state letter) of processes whose real uid is in [uid_base, uid_base + count).

    Also what tests and benchmarks use on the host to see whether any cell process is left.

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


def _kill_uid(uid: int) -> None:
    for pid, _, _ in cell_processes(uid, 1):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _network_check() -> str:
    """Inside bwrap's empty network namespace even the zygote cannot route anywhere."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never a real host
        return "routable"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    finally:
        probe.close()


def main() -> None:
    """Entry point inside the sandbox: read the config frame, warm up, report, serve."""
    cfg = protocol.read_frame(CONTROL_IN)
    if cfg is None:
        return
    for key, value in cfg.get("thread_env", {}).items():
        os.environ[key] = value  # BLAS thread counts must be set before numpy loads its library
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    sys.stdout = sys.stderr  # fd 1 carries protocol frames: a stray print from a library must not land there
    zygote = Zygote(cfg)
    started = time.monotonic()
    zygote.preload()
    zygote.measure_released_headroom()
    warm_s = time.monotonic() - started
    os.makedirs(cfg["scratch_root"], exist_ok=True)
    report = zygote.probe()
    report["warmup_s"] = round(warm_s, 3)
    report["preloaded"] = cfg.get("preload", [])
    report["released_memory"] = zygote.released_memory_note
    zygote.send({"op": "ready", "report": report})
    zygote.serve()
