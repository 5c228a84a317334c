"""The forker: the process that holds the warm image, forks every cell and reaps it."""

from __future__ import annotations

import concurrent.futures
import os
import platform
import time

import pytest

from rstar.orphan_guard import descendants, stat_fields


def _kernel_at_least(major: int, minor: int) -> bool:
    release = platform.release().split("-")[0].split(".")
    return (int(release[0]), int(release[1])) >= (major, minor)


@pytest.mark.skipif(not (_kernel_at_least(6, 1) and os.path.isdir("/sys/kernel/mm/transparent_hugepage")),
                    reason="MADV_COLLAPSE needs Linux 6.1 with transparent huge pages built in")
def test_the_warm_image_sits_in_huge_pages(sandbox_pool):
    # The preloads (numpy, sympy, scipy, math-verify) build about 100 MB of heap; most of it is in 2 MB runs.
    assert sandbox_pool.pool.health()["zygote"]["huge_page_mb"] >= 16
    # A cell's writes into the shared image are its own (copy-on-write splits the huge page): the next cell sees
    # the preloaded module as it was.
    assert sandbox_pool.run("import numpy, sympy\nnumpy.pi = 3\nsympy.S.Half = 7\nprint(numpy.pi)").stdout == "3\n"
    assert sandbox_pool.run("import numpy, sympy\nprint(numpy.pi, sympy.S.Half)").stdout == "3.141592653589793 1/2\n"


def test_a_dead_forker_takes_its_zygote_down_and_both_are_replaced(sandbox_host_processes_fn):
    import signal

    from conftest import SyncPool
    from rstar.sandbox.settings import SandboxSettings

    settings = SandboxSettings(workers=1, uid_base=65020, preload=[])
    pool = SyncPool(settings)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            in_flight = ex.submit(pool.run, "import time; time.sleep(5)")
            time.sleep(0.5)
            # bwrap -> bwrap's init -> the zygote -> the forker -> cells: one process, in this pool's tree and
            # not a cell, is every cell's parent.
            cells = sandbox_host_processes_fn(settings.uid_base, settings.workers + settings.spare_cells)
            parents = {int(stat_fields(pid)[1]) for pid in cells}
            assert cells and len(parents) == 1
            forker = parents.pop()
            assert forker in descendants(pool.pool._zygote.proc.pid) and forker not in cells
            os.kill(forker, signal.SIGKILL)
            lost = in_flight.result(30)
        assert lost.status == "internal_error" and "restarted" in lost.stderr
        assert pool.run("print('again')").stdout == "again\n"
        assert pool.pool.metrics.zygote_restarts == 1
        assert not set(cells) & set(sandbox_host_processes_fn(settings.uid_base, settings.workers + settings.spare_cells))
    finally:
        pool.close()


def test_the_stray_sweep_waits_while_a_spawn_is_in_flight(monkeypatch):
    # A spare the forker has forked but the zygote has not received yet runs as a cell uid in a process group
    # the zygote does not know: a sweep then would kill it as a stray (seen in CI: its call failed at once).
    from rstar.sandbox import procs, zygote
    from rstar.sandbox.forker import Forker

    class Quiet(Forker):
        def __init__(self) -> None:
            self.asked = {}

    forker = Quiet()
    cfg = {"slots": 2, "drop_uid": True, "uid_base": 61000, "max_output_bytes": 1000, "max_sessions": 1,
           "session_ttl_s": 60, "groups_sealed": True, "images": {"max_images": 1, "max_pixels": 1, "max_bytes": 1},
           "container_caps": {"max_files": 1, "max_bytes": 1}}
    sweeps = []
    monkeypatch.setattr(procs, "kill_strays", lambda *args: sweeps.append(args) or [])
    z = zygote.Zygote(cfg, forker)
    z.last_sweep -= zygote.STRAY_SWEEP_S + 1
    forker.asked[1] = (61000, "/tmp/slot0")
    z.sweep_strays()
    assert sweeps == []
    forker.asked.clear()
    z.sweep_strays()
    assert len(sweeps) == 1
