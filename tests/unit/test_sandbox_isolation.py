"""Refusing to run without isolation, the unsafe mode's warning, and the layer report."""

from __future__ import annotations

import asyncio
import logging
import tempfile

import pytest

from rstar.sandbox import harden, launch
from rstar.sandbox.pool import SandboxPool
from rstar.sandbox.settings import SandboxSettings


def test_refuses_to_start_without_bubblewrap():
    async def start():
        pool = SandboxPool(SandboxSettings(bwrap_path="/nonexistent/bwrap"))
        try:
            await pool.start()
        finally:
            await pool.close()

    with pytest.raises(launch.IsolationError, match="--unsafe-no-isolation"):
        asyncio.run(start())


def test_refuses_without_seccomp():
    host = launch.HostReport(bwrap="/usr/bin/bwrap", seccomp_bpf=None, seccomp_error="libseccomp missing")
    with pytest.raises(launch.IsolationError, match="seccomp"):
        launch.plan(SandboxSettings(), host)


@pytest.mark.parametrize("skipped, sealed", [([], True), (["setpgid"], False), (["setsid"], False), (["bpf"], True)])
def test_killpg_alone_ends_a_cell_only_when_seccomp_denies_leaving_the_group(skipped, sealed, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    host = launch.HostReport(bwrap="/usr/bin/bwrap", seccomp_bpf=b"\0" * 8, seccomp_skipped=skipped)
    assert launch.plan(SandboxSettings(), host).config["groups_sealed"] is sealed
    unsafe = launch.plan(SandboxSettings(unsafe_no_isolation=True), host)
    assert unsafe.config["groups_sealed"] is False
    assert list(tmp_path.iterdir()) == []  # a plan is pure: the unsafe mode's scratch dir is made by the start


def test_unsafe_mode_runs_and_warns_on_every_start(caplog, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    settings = SandboxSettings(unsafe_no_isolation=True, bwrap_path="/nonexistent/bwrap", workers=1, preload=[])

    async def use():
        results = []
        for _ in range(2):  # two starts, two warnings
            async with SandboxPool(settings) as pool:
                results.append((await pool.run({"code": "print(1)"}), await pool.run({"code": "while True: pass", "timeout_s": 0.3}),
                                pool.health()))
                scratch = list(tmp_path.glob("rstar-cells-*"))  # the cells' scratch lives on the host here
                assert len(scratch) == 1 and any(scratch[0].iterdir())
            assert list(tmp_path.glob("rstar-cells-*")) == []
        return results

    with caplog.at_level(logging.WARNING, logger="rstar.sandbox"):
        results = asyncio.run(use())
    assert sum("UNSAFE" in record.message for record in caplog.records) == 2
    for ok, timeout, health in results:
        assert ok.stdout == "1\n" and timeout.status == "timeout"  # rlimits and the wall timeout still apply
        assert health["isolated"] is False
        assert not health["layers"]["namespaces"]["active"] and not health["layers"]["seccomp"]["active"]


def test_layer_report_matches_the_kernel(sandbox_pool):
    layers = sandbox_pool.pool.health()["layers"]
    abi = harden.landlock_abi()
    assert layers["landlock"]["active"] is (abi > 0)
    assert (f"ABI {abi}" if abi else "not used") in layers["landlock"]["detail"]
    assert layers["seccomp"]["active"] and "EPERM" in layers["seccomp"]["detail"]
    assert layers["fd_hygiene"]["active"] and layers["env_scrub"]["active"]
    assert layers["cgroups"]["active"] is False and "RLIMIT" in layers["cgroups"]["detail"]


def test_seccomp_program_is_real_bpf():
    program, skipped = harden.compile_seccomp()
    assert len(program) % 8 == 0 and len(program) // 8 > len(harden.DENIED_SYSCALLS)
    assert "socket" not in skipped and "clone3" not in skipped


def test_bwrap_command_shares_nothing_it_should_not():
    host = launch.detect_host(SandboxSettings())
    argv = launch.plan(SandboxSettings(), host).argv
    for flag in ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
                 "--new-session", "--clearenv"):
        assert flag in argv
    binds = [argv[i + 2] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert "--bind" not in argv  # nothing writable from the host
    assert "/" not in binds and "/etc" not in binds and "/root" not in binds
