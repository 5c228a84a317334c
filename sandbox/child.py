"""The cell side of the sandbox: forking a cell process, hardening it, and serving its jobs.

A child is forked from the warm image (by the forker, see `forker.py`) with five fds in a fixed layout (stdin,
stdout, stderr, job pipe, status pipe), the cell environment and default signal dispositions already in place.
Before any untrusted code it enters its own session and hardens itself (`harden_self`: every layer or none),
then blocks reading its job pipe. A spare serves one job and exits; a session child loops over jobs and keeps
its globals. Each job's outcome goes back as one JSON line on the status pipe; the zygote reads the child's
stdout and stderr itself.

`Child` is the zygote's handle on such a process: its pid, uid, scratch dir and the parent's pipe ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shutil
import signal
import _signal
import socket
import sys
from dataclasses import dataclass, field

from . import cell, figures, harden, protocol

PR_GET_NO_NEW_PRIVS = 39
PR_GET_SECCOMP = 21
# Fixed fd layout inside every child. A container's cell holds its data dir at CHILD_DATA (what /mnt/data
# links to, launch.MNT_DATA_TARGET); the Landlock ruleset sits above it only until the child applies it.
CHILD_STDIN, CHILD_STDOUT, CHILD_STDERR, CHILD_JOB, CHILD_STATUS = 0, 1, 2, 3, 4
CHILD_DATA, CHILD_RULESET = 5, 6
MB = 1 << 20


@dataclass
class ChildSetup:
    """What every child applies to itself, fixed when the zygote starts.

    `released_headroom` is the room code-judge gave a program's own allocations (see
    `_enter_released_semantics`); None when a fresh interpreter could not be measured, reported at /health.
    `rulesets` holds the zygote's Landlock ruleset fd for each scratch dir (see `landlock_ruleset`).
    """

    cfg: dict
    landlock_abi: int
    seccomp: harden.SeccompProgram | None
    images: figures.Limits
    released_headroom: int | None = None
    rulesets: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: dict) -> "ChildSetup":
        return cls(cfg=cfg, landlock_abi=harden.landlock_abi() if cfg.get("landlock") else 0,
                   seccomp=harden.SeccompProgram(bytes.fromhex(cfg["seccomp_bpf"])) if cfg.get("seccomp_bpf") else None,
                   images=figures.Limits.of_config(cfg["images"]))

    def landlock_ruleset(self, scratch: str) -> int | None:
        """The Landlock ruleset for cells working in `scratch`, built once by the (privileged) zygote and
        inherited by every child forked for that dir, which only applies it: the rules name inodes, and a
        scratch dir is emptied between cells, never replaced. None when Landlock is not used."""
        if not self.landlock_abi:
            return None
        if scratch not in self.rulesets:
            ll = self.cfg["landlock"]
            self.rulesets[scratch] = harden.landlock_prepare(self.landlock_abi, ll["read_only"], [scratch], ll["devices"])
        return self.rulesets[scratch]


@dataclass(frozen=True)
class Container:
    """What makes a session child a container's: the data dir it works in (besides its own scratch dir), and
    the address space its code may map beyond the warm image (None: memory_mb is the whole cap, as for any cell)."""

    data_dir: str
    room_mb: int | None


class Child:
    """A forked child and the zygote's ends of its pipes."""

    def __init__(self, pid: int, uid: int | None, scratch: str, out: int, err: int, job: int, status: int,
                 born: float, container: Container | None = None) -> None:
        self.pid, self.uid, self.scratch, self.container = pid, uid, scratch, container
        self.out, self.err, self.job, self.status = out, err, job, status
        self.exit_status: int | None = None  # waitpid status once reaped
        self.born = born

    def fds(self) -> tuple[int, ...]:
        return self.out, self.err, self.job, self.status


# ------------------------------------------------------------------------------ zygote side of a fork
def prepare_scratch(path: str, uid: int | None) -> None:
    """An empty 0700 directory owned by the cell's uid: what a new child starts in."""
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


def own_container(data_dir: str, uid: int | None) -> None:
    """Give a container's files to the uid of the cell about to use them (the zygote's own uid once no cell
    does), so that only that cell's uid can reach them: uids are reused by other sessions later, and uploads
    arrive as the server's. Nothing is emptied: the files are the container's."""
    if uid is None:
        return
    os.chown(data_dir, uid, uid)
    os.chmod(data_dir, 0o700)
    for root, dirs, files in os.walk(data_dir):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


def fork_child(setup: ChildSetup, uid: int | None, scratch: str, persistent: bool, cpu_s: int, now: float,
               container: Container | None = None) -> Child:
    """Fork a child that hardens itself and waits for work; the caller gets non-blocking ends of its output and
status pipes and the blocking write end of its job pipe."""
    prepare_scratch(scratch, uid)
    # A container's ruleset covers its data dir too; the child builds it itself, as containers come and go.
    ruleset = setup.landlock_ruleset(scratch) if container is None else None
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    job_r, job_w = os.pipe()
    st_r, st_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ends = {CHILD_STDOUT: out_w, CHILD_STDERR: err_w, CHILD_JOB: job_r, CHILD_STATUS: st_w}
        if ruleset is not None:
            ends[CHILD_RULESET] = ruleset
        _child_main(setup, ends, uid, scratch, persistent, cpu_s, container)
    for fd in (out_w, err_w, job_r, st_w):
        os.close(fd)
    for fd in (out_r, err_r, st_r):  # os.pipe fds are already non-inheritable; the job pipe stays blocking
        os.set_blocking(fd, False)
    return Child(pid, uid, scratch, out_r, err_r, job_w, st_r, now, container)


# ------------------------------------------------------------------------------------ in the child
class _ChildSetupError(Exception):
    pass


def _place_fds(targets: dict[int, int]) -> None:
    """dup2 each source onto its target fd, then close every other fd (a gap in the layout is closed too).

    Sources are first moved above the targets so no dup2 overwrites a source still needed.
    """
    high = {target: fcntl.fcntl(src, fcntl.F_DUPFD, 10) for target, src in targets.items()}
    for target, src in high.items():
        os.dup2(src, target, inheritable=True)
    for gap in set(range(max(targets))) - set(targets):
        with contextlib.suppress(OSError):
            os.close(gap)
    os.closerange(max(targets) + 1, 1 << 20)


def _child_main(setup: ChildSetup, ends: dict[int, int], uid: int | None, scratch: str, persistent: bool,
                cpu_s: int, container: Container | None) -> None:
    """Body of a forked child; never returns."""
    code = 70
    status_fd = ends[CHILD_STATUS]  # until the fds are placed
    try:
        try:
            # Measured before hardening: Landlock then hides /proc. The few objects a job adds are noise.
            address_space = harden.address_space()
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDWR)
            if container is not None:
                ends[CHILD_DATA] = os.open(container.data_dir, os.O_PATH | os.O_DIRECTORY)
            _place_fds({CHILD_STDIN: devnull, **ends})
            status_fd = CHILD_STATUS
            # The forker's SIGCHLD handler, undone through _signal: signal.signal's enum wrapping runs enough
            # Python to copy dozens of pages in every fresh child.
            signal.set_wakeup_fd(-1)
            _signal.signal(signal.SIGCHLD, _signal.SIG_DFL)
            layers = harden_self(setup, uid, scratch, cpu_s, container, address_space)
        except BaseException as exc:  # noqa: BLE001 - reported to the zygote, then the child exits
            _send_status({"status": "internal_error", "detail": f"hardening failed: {type(exc).__name__}: {exc}"}, status_fd)
            raise _ChildSetupError from exc
        try:
            _serve_jobs(setup, persistent, layers, address_space)
        except BaseException as exc:  # noqa: BLE001 - the job's caller is told why its cell got no answer
            _send_status({"status": "internal_error", "detail": f"the cell process failed: {type(exc).__name__}: {exc}"})
            raise
        code = 0
    finally:
        os._exit(code)


def harden_self(setup: ChildSetup, uid: int | None, scratch: str, cpu_s: int, container: Container | None,
                address_space: int) -> dict:
    """Each layer is applied or the child dies: there is no partial sandbox. Returns the layers applied."""
    cfg = setup.cfg
    layers = {}
    ruleset = CHILD_RULESET
    if setup.landlock_abi and container is not None:  # built while still privileged, as the zygote builds the others
        ll = cfg["landlock"]
        ruleset = harden.landlock_prepare(setup.landlock_abi, ll["read_only"], [scratch, container.data_dir], ll["devices"])
    memory_mb = cfg["memory_mb"]
    if container is not None and container.room_mb is not None:
        memory_mb = -(-address_space // MB) + container.room_mb
    layers["rlimits"] = harden.set_rlimits(
        memory_mb=memory_mb, cpu_s=cpu_s, file_size_mb=cfg["file_size_mb"],
        open_files=cfg["open_files"], processes=cfg["processes"] if uid is not None else None)
    if uid is not None:
        harden.drop_privileges(uid)
        layers["uid"] = uid
    harden.set_no_new_privs()
    if setup.landlock_abi:
        harden.landlock_apply(ruleset)  # closes it: a cell never holds the ruleset
        layers["landlock"] = setup.landlock_abi
    if setup.seccomp is not None:
        harden.load_seccomp(setup.seccomp)
        layers["seccomp"] = True
    os.chdir(scratch if container is None else container.data_dir)
    os.environ["HOME"] = os.environ["TMPDIR"] = scratch  # the rest of the environment is the forker's: cfg["env"]
    return layers


def _send_status(message: dict, fd: int = CHILD_STATUS) -> None:
    # A line with images is larger than the pipe: a write may take only part of it.
    view = memoryview((json.dumps(message) + "\n").encode())
    try:
        while view:
            view = view[os.write(fd, view):]
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


def _serve_jobs(setup: ChildSetup, persistent: bool, layers: dict, address_space: int) -> None:
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
                _enter_released_semantics(setup, address_space, float(job["timeout_s"]))
            _set_stdin(job.get("stdin"))
            figures.begin(setup.images, capture_show=not released)
            if job.get("history"):
                cell.replay(job["history"], namespace)
                figures.discard()
            run = cell.run_cell_released if released else cell.run_cell
            status, exit_code = run(job["code"], namespace)
            message = {"status": status, "exit_code": exit_code}
            images, notes = figures.collect()
            if images:
                message["images"] = images
            if notes:
                message["image_notes"] = notes
        elif kind == "verify":
            from . import verify

            message = {"status": "ok", "exit_code": 0, "value": verify.score(job["response"], job["gold"], job["rule"])}
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


def _enter_released_semantics(setup: ChildSetup, address_space: int, timeout_s: float) -> None:
    """What a code-judge process running rStar2-Agent's wrapper has that our cells do not:

    - stdout buffered as python3 buffers a pipe, so what is still buffered when an exception escapes is
      lost (cell.run_cell_released drops it);
    - a timer that, at the wall limit, prints 'Suicide from timeout.' (flushing what was buffered) and
      ends the process; the zygote's own deadline then comes one second later, as code-judge's worker
      gave its subprocess one second more;
    - the address space code-judge left the program: 256 + 128 MB minus what a fresh python3 has mapped
      by then, on top of what this child already maps (`address_space`; the preloaded libraries are free
      here).
    """
    sys.stdout = open(CHILD_STDOUT, "w", encoding="utf-8", errors="backslashreplace", closefd=False)

    def suicide(*_) -> None:
        print("Suicide from timeout.", flush=True)
        _send_status({"status": "timeout", "exit_code": None})
        os._exit(0)

    signal.signal(signal.SIGALRM, suicide)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    if setup.released_headroom is not None:
        harden.cap_address_space(address_space + setup.released_headroom)


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
