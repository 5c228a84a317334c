"""Host side of starting a zygote: feature detection, the bubblewrap command line and the zygote's config.

The zygote runs `python -I -S` (no site, no user paths, no PYTHON* variables) with exactly the paths it
needs on sys.path. Inside bubblewrap it sees: /usr and /etc/fonts read-only, the interpreter prefix and the site-packages
directory read-only (their parents created 0755, since bwrap would make them 0700 and the cell uids could
not traverse them), this package at /opt/rstar/sandbox, a fresh /proc and minimal /dev, and a size-capped
tmpfs at /tmp that holds the cells' scratch directories. No network, pid, ipc, uts or cgroup namespace is
shared with the host.
"""

from __future__ import annotations

import logging
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from . import harden
from .settings import SandboxSettings

log = logging.getLogger("rstar.sandbox")

PACKAGE_DIR = Path(__file__).resolve().parent
IN_SANDBOX_PACKAGE_PARENT = "/opt/rstar"
IN_SANDBOX_SCRATCH = "/tmp/cells"
IN_SANDBOX_CONTAINERS = "/var/lib/rstar/containers"
# A container cell holds its data dir open at this fd (child.CHILD_DATA), so /mnt/data, a link to it, is that
# cell's own container in every cell, through one mount of them all (Landlock keeps each cell to its own).
MNT_DATA, MNT_DATA_TARGET = "/mnt/data", "/proc/self/fd/5"
ZYGOTE_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER")
DEVICES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]
# Libraries that start one thread per core unless told otherwise; a cell gets one core's worth.
THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1"}
CELL_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8", **THREAD_ENV}


class IsolationError(RuntimeError):
    """The sandbox cannot isolate cells here and was not told to run unsafely."""


@dataclass
class HostReport:
    """What the host offers, found before the zygote starts."""

    bwrap: str | None = None
    bwrap_version: str = ""
    root: bool = False
    landlock_abi: int = 0
    seccomp_bpf: bytes | None = None
    seccomp_skipped: list[str] = field(default_factory=list)
    seccomp_error: str = ""


def detect_host(settings: SandboxSettings) -> HostReport:
    report = HostReport(root=os.geteuid() == 0, landlock_abi=harden.landlock_abi())
    path = shutil.which(settings.bwrap_path)
    if path:
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
            report.bwrap, report.bwrap_version = path, out.stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("bubblewrap at %s does not run: %s", path, exc)
    try:
        report.seccomp_bpf, report.seccomp_skipped = harden.compile_seccomp()
    except Exception as exc:  # noqa: BLE001 - missing libseccomp/pyseccomp is a reportable condition
        report.seccomp_error = f"{type(exc).__name__}: {exc}"
    return report


def _site_dirs() -> list[str]:
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    seen: list[str] = []
    for d in dirs:
        real = os.path.realpath(d)
        if os.path.isdir(real) and real not in seen:
            seen.append(real)
    return seen


def _interpreter() -> tuple[str, str]:
    """(real interpreter binary, its prefix). The venv's python is a symlink; bwrap binds the target."""
    binary = os.path.realpath(sys.executable)
    return binary, os.path.realpath(sys.base_prefix)


def _boot_code(package_parent: str, site_dirs: list[str]) -> str:
    return (f"import sys; sys.path[:0] = {[package_parent, *site_dirs]!r}; "
            f"import {PACKAGE_DIR.name}.zygote as z; z.main()")


@dataclass
class LaunchPlan:
    argv: list[str]
    config: dict
    isolated: bool


def plan(settings: SandboxSettings, host: HostReport) -> LaunchPlan:
    binary, prefix = _interpreter()
    sites = _site_dirs()
    isolated = not settings.unsafe_no_isolation
    if isolated:
        missing = []
        if host.bwrap is None:
            missing.append(f"bubblewrap ({settings.bwrap_path!r} not found; apt-get install bubblewrap)")
        if host.seccomp_bpf is None:
            missing.append(f"seccomp ({host.seccomp_error or 'unavailable'})")
        if missing:
            raise IsolationError("cannot isolate cells: missing " + ", ".join(missing)
                                 + ". Pass --unsafe-no-isolation to run model code unconfined (never on a shared machine).")
    config = {
        "slots": settings.workers + settings.spare_cells,
        "max_sessions": settings.max_sessions,
        "uid_base": settings.uid_base,
        "drop_uid": isolated and host.root,
        "memory_mb": settings.memory_mb,
        "cpu_s": int(settings.max_timeout_s) + 1,
        "session_cpu_s": settings.session_cpu_s,
        "file_size_mb": settings.max_file_size_mb,
        "open_files": settings.max_open_files,
        "processes": settings.max_processes,
        "max_output_bytes": settings.max_output_bytes,
        "max_output_chars": settings.max_output_chars,
        "session_ttl_s": settings.session_ttl_s,
        "images": {"max_images": settings.max_images_per_cell, "max_pixels": settings.max_image_pixels, "max_bytes": settings.max_image_bytes},
        "preload": list(settings.preload),
        "env": dict(CELL_ENV),
        "thread_env": dict(THREAD_ENV),
        "seccomp_bpf": host.seccomp_bpf.hex() if isolated and host.seccomp_bpf else None,
        "groups_sealed": bool(isolated and host.seccomp_bpf
                              and not set(harden.GROUP_SYSCALLS) & set(host.seccomp_skipped)),
        "landlock": None,
        "containers_root": None,
        "container_caps": {"max_files": settings.container_max_files, "max_bytes": settings.container_max_bytes},
    }
    if settings.containers_dir:
        # Traversable, not listable: a cell without Landlock still cannot find the other containers' ids.
        os.makedirs(settings.containers_dir, exist_ok=True)
        os.chmod(settings.containers_dir, 0o711)
    if not isolated:
        config["scratch_root"] = None  # a host temp dir, made and removed by the process that runs this plan
        config["containers_root"] = settings.containers_dir
        argv = [binary, "-I", "-S", "-B", "-c", _boot_code(str(PACKAGE_DIR.parent), sites)]
        return LaunchPlan(argv, config, False)

    config["scratch_root"] = IN_SANDBOX_SCRATCH
    read_only = ["/usr", prefix, *sites]
    if host.landlock_abi:
        config["landlock"] = {"read_only": read_only, "devices": DEVICES}
    argv = [host.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
    for key, value in {**CELL_ENV, "HOME": "/tmp"}.items():
        argv += ["--setenv", key, value]
    # fontconfig's configuration, for matplotlib's font list in the warm image (Landlock keeps cells out of it)
    argv += ["--ro-bind", "/usr", "/usr", "--ro-bind-try", "/etc/fonts", "/etc/fonts"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(settings.scratch_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    made: set[str] = {"/", "/usr", "/tmp", "/proc", "/dev"}
    binds = [(p, p) for p in (prefix, *sites) if not p.startswith("/usr/")]
    binds.append((str(PACKAGE_DIR), f"{IN_SANDBOX_PACKAGE_PARENT}/{PACKAGE_DIR.name}"))
    mounted = [dest for _, dest in binds] + [IN_SANDBOX_CONTAINERS, MNT_DATA] * bool(settings.containers_dir)
    for dest in mounted:
        for parent in reversed(Path(dest).parents):
            p = str(parent)
            if p not in made:
                argv += ["--perms", "0755", "--dir", p]
                made.add(p)
    for src, dest in binds:
        argv += ["--ro-bind", src, dest]
    if settings.containers_dir:
        config["containers_root"] = IN_SANDBOX_CONTAINERS
        argv += ["--bind", settings.containers_dir, IN_SANDBOX_CONTAINERS, "--symlink", MNT_DATA_TARGET, MNT_DATA]
    if host.root:
        for cap in ZYGOTE_CAPS:
            argv += ["--cap-add", cap]
    argv += ["--", binary, "-I", "-S", "-B", "-c", _boot_code(IN_SANDBOX_PACKAGE_PARENT, sites)]
    return LaunchPlan(argv, config, True)


def describe_layers(settings: SandboxSettings, host: HostReport, launch: LaunchPlan, probe: dict) -> dict:
    """The /health list: each layer, whether it is in force (checked from inside a hardened child), and how."""
    layers = probe.get("layers", {})

    def layer(active: bool, detail: str) -> dict:
        return {"active": bool(active), "detail": detail}

    netns = probe.get("zygote_network") in ("ENETUNREACH", "ENETDOWN", "EHOSTUNREACH")
    abi = layers.get("landlock", 0)
    fds = probe.get("open_fds")
    env_keys = set(probe.get("env_keys", []))
    return {
        "namespaces": layer(launch.isolated and netns,
                            f"{host.bwrap_version}: private net/pid/ipc/uts/cgroup, read-only /usr + interpreter, "
                            f"tmpfs /tmp ({settings.scratch_mb} MB); network from inside: {probe.get('zygote_network')}"
                            if launch.isolated else "not used (--unsafe-no-isolation)"),
        "rlimits": layer("rlimits" in layers, layers.get("rlimits", "not applied")),
        "uid_per_slot": layer("uid" in layers,
                              f"cells run as uid {settings.uid_base}+slot (sessions above); NPROC counts per cell"
                              if "uid" in layers else "cells keep the service's uid (needs root); NPROC not per cell"),
        "no_new_privs": layer(probe.get("no_new_privs") == 1, "PR_SET_NO_NEW_PRIVS"),
        "seccomp": layer(probe.get("seccomp_mode") == 2 and probe.get("socket") == "EPERM",
                         f"deny-list BPF ({len(harden.DENIED_SYSCALLS)} syscalls + namespace flags on clone, clone3 ENOSYS); "
                         f"socket() from a cell: {probe.get('socket')}"
                         + (f"; unknown here: {', '.join(host.seccomp_skipped)}" if host.seccomp_skipped else "")
                         if launch.isolated else f"not used ({host.seccomp_error or '--unsafe-no-isolation'})"),
        "landlock": layer(bool(abi), f"ABI {abi}: read-only system, read-write scratch only, no exec, TCP denied"
                          + (", signals and abstract sockets scoped" if abi >= 6 else "")
                          if abi else f"not used (kernel ABI {host.landlock_abi})"),
        "fd_hygiene": layer(fds == [0, 1, 2, 3, 4], f"open fds in a cell: {fds}"),
        "env_scrub": layer(bool(env_keys) and env_keys <= set(CELL_ENV) | {"HOME", "TMPDIR"},
                           f"cell environment: {sorted(env_keys)}"),
        "wall_timeout": layer(True, "the zygote kills the cell's whole process group at the deadline"),
        "cgroups": layer(False, "not used: memory and process caps come from RLIMIT_AS and RLIMIT_NPROC"),
    }


REQUIRED_LAYERS = ("namespaces", "rlimits", "no_new_privs", "seccomp", "fd_hygiene", "env_scrub")
