"""Per-child hardening: rlimits, uid drop, no_new_privs, Landlock and seccomp.

Everything here runs in a freshly forked child of the zygote, *before* any untrusted code, in this order:
rlimits -> drop to the slot uid -> no_new_privs -> Landlock restrict_self -> seccomp. seccomp comes last
because it denies calls the earlier steps need (setsid was done by the caller already). The Landlock
ruleset itself is built by the zygote, once per scratch dir, while privileged (`landlock_prepare`).

The seccomp program is compiled once on the host side (`compile_seccomp`, with libseccomp through
pyseccomp, which knows every architecture's syscall numbers) and shipped to the zygote as raw BPF bytes; the
child installs it with one prctl. That keeps libseccomp, and the `ldconfig` call ctypes makes to find it,
out of the sandbox.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

# Namespace flags a cell must never pass to clone(): each would give it a fresh view of something we isolate.
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

# Leaving the process group: with both denied, one killpg ends everything a cell started.
GROUP_SYSCALLS = ("setsid", "setpgid")
# Denied with EPERM. Grouped by what they would let a cell do.
DENIED_SYSCALLS = (
    # network (the netns is a second layer; AF_UNIX socketpair stays allowed, it reaches nothing)
    "socket",
    *GROUP_SYSCALLS,
    # inspecting or steering other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    # changing the filesystem view or namespaces
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
    "open_by_handle_at", "name_to_handle_at",
    # kernel attack surface no cell needs
    "bpf", "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key",
    "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "iopl", "ioperm",
    "settimeofday", "clock_settime", "adjtimex", "vhangup",
)


def compile_seccomp() -> tuple[bytes, list[str]]:
    """Compile the deny-list filter to raw BPF for this machine's architecture.

    Returns the program and the rule names that could not be added (syscalls this libseccomp does not know).
    Raises ImportError/RuntimeError when libseccomp is unavailable; the caller reports the layer as missing.
    """
    import tempfile

    import pyseccomp as sc

    flt = sc.SyscallFilter(defaction=sc.ALLOW)
    skipped: list[str] = []
    for name in DENIED_SYSCALLS:
        try:
            flt.add_rule(sc.ERRNO(errno.EPERM), name)
        except (OSError, RuntimeError, ValueError):
            skipped.append(name)
    for flag in CLONE_NAMESPACE_FLAGS.values():
        flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory, where BPF cannot look: answer ENOSYS so libc falls back to clone(),
    # whose flags the rules above do see.
    try:
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    except (OSError, RuntimeError, ValueError):
        skipped.append("clone3")
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        program = fh.read()
    if not program or len(program) % 8:
        raise RuntimeError(f"libseccomp exported a malformed program ({len(program)} bytes)")
    return program, skipped


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class SeccompProgram:
    """A BPF program laid out as the kernel reads it. Built once in the zygote, so a forked child installs
    it with one prctl instead of building ctypes types and copies before every cell."""

    def __init__(self, program: bytes) -> None:
        count = len(program) // 8
        self._filters = (_SockFilter * count).from_buffer_copy(program)  # kept alive: fprog points into it
        self.fprog = _SockFprog(count, ctypes.cast(self._filters, ctypes.POINTER(_SockFilter)))


def load_seccomp(program: SeccompProgram) -> None:
    """Install a BPF program (needs no_new_privs set first). Irreversible for this process and its children."""
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program.fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {os.strerror(err)}")


def set_no_new_privs() -> None:
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"no_new_privs: {os.strerror(err)}")


def set_rlimits(*, memory_mb: int, cpu_s: int, file_size_mb: int, open_files: int, processes: int | None) -> str:
    """Apply the per-cell resource limits; returns a one-line description for /health."""
    mb = 1024 * 1024
    limits = [
        (resource.RLIMIT_AS, memory_mb * mb),
        (resource.RLIMIT_FSIZE, file_size_mb * mb),
        (resource.RLIMIT_NOFILE, open_files),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_MSGQUEUE, 0),
        (resource.RLIMIT_MEMLOCK, 0),
    ]
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    # Soft CPU limit sends SIGXCPU (reported as a timeout); the hard limit one second later is SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    if processes is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    nproc = f", NPROC {processes}" if processes is not None else ", NPROC not enforced (no per-slot uid)"
    return f"AS {memory_mb} MB, CPU {cpu_s} s, FSIZE {file_size_mb} MB, NOFILE {open_files}, CORE 0{nproc}"


# code-judge's address-space cap for a program: MAX_MEMORY (256 MB) plus 128 MB "for python overhead", set
# with RLIMIT_AS on the whole `python3 source.py` process.
CODE_JUDGE_ADDRESS_SPACE = (256 + 128) * 1024 * 1024
# What a code-judge program has imported when the model's code starts: code-judge's limit prologue and
# rStar2-Agent's wrapper around the code.
CODE_JUDGE_PRELUDE = "import signal, resource, os, time, base64, sys, ast, traceback, typing, linecache, types, contextlib, io"


def address_space() -> int:
    """This process's mapped address space in bytes (VmSize), what RLIMIT_AS caps."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def fresh_python_address_space(python: str) -> int:
    """Address space of a fresh `python` that has imported what a code-judge program has when its code
    starts; code-judge's cap minus this is the room the model's code had there."""
    import subprocess

    probe = CODE_JUDGE_PRELUDE + "; print(open('/proc/self/statm').read().split()[0])"
    pages = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True, timeout=30).stdout
    return int(pages) * os.sysconf("SC_PAGE_SIZE")


def cap_address_space(limit: int) -> None:
    """Lower RLIMIT_AS (soft and hard) to `limit` bytes, never above the cap already in force."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    value = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (value, value))


def lower_cpu_limit(cpu_s: int) -> None:
    """A job may ask for less CPU than the spare was prepared with; lowering needs no privilege."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    used = resource.getrusage(resource.RUSAGE_SELF)
    base = int(used.ru_utime + used.ru_stime)
    new_soft = min(soft, base + cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, (new_soft, min(hard, new_soft + 1)))


def drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


# ---------------------------------------------------------------------------------------------- Landlock
_LANDLOCK_CREATE_RULESET = 444
_LANDLOCK_ADD_RULE = 445
_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """0 when the kernel has no Landlock (or it is disabled), else its ABI version."""
    abi = _libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(abi), 0)


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def landlock_prepare(abi: int, read_only: list[str], read_write: list[str], devices: list[str]) -> int:
    """Build a ruleset (while still privileged) and return its fd; apply it with `landlock_apply`.

    Reads are allowed below `read_only` (no execute: a cell cannot start programs), everything but execute
    below `read_write`, read/write/ioctl on the `devices` files. TCP bind/connect are denied outright (ABI 4+),
    and signals and abstract unix sockets are scoped to the cell's own domain (ABI 6+).
    """
    handled_fs = _fs_rights(abi)
    attr = _RulesetAttr(handled_fs, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    fd = _libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    read = FS_READ_FILE | FS_READ_DIR
    write_all = handled_fs & ~(FS_EXECUTE | FS_MAKE_CHAR | FS_MAKE_BLOCK | FS_IOCTL_DEV)
    device = (FS_READ_FILE | FS_WRITE_FILE | (FS_IOCTL_DEV if abi >= 5 else 0) | (FS_TRUNCATE if abi >= 3 else 0))
    for paths, access in ((read_only, read), (read_write, write_all), (devices, device)):
        for path in paths:
            if not os.path.exists(path):
                continue
            allowed = access
            if not os.path.isdir(path):
                allowed &= ~(FS_READ_DIR | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_CHAR | FS_MAKE_DIR | FS_MAKE_REG
                            | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK | FS_MAKE_SYM | FS_REFER)
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(allowed & handled_fs, pfd)
                if _libc.syscall(_LANDLOCK_ADD_RULE, fd, _LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"landlock_add_rule({path}): {os.strerror(err)}")
            finally:
                os.close(pfd)
    return fd


def landlock_apply(ruleset_fd: int) -> None:
    """Restrict this process (and everything it starts) to the ruleset; needs no_new_privs first."""
    try:
        if _libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset_fd)
