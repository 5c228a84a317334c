"""Every per-cell limit, and the pool's bounded queue, hit for real."""

from __future__ import annotations

import concurrent.futures
import time


def test_wall_timeout_kills_a_sleeping_cell(sandbox_pool):
    started = time.monotonic()
    r = sandbox_pool.run("import time\nprint('started', flush=True)\ntime.sleep(30)", timeout_s=0.5)
    assert r.status == "timeout" and r.exit_code is None
    assert r.stdout == "started\n"  # what the cell printed before the deadline is kept
    assert time.monotonic() - started < 5


def test_cpu_loop_times_out(sandbox_pool):
    r = sandbox_pool.run("while True:\n    pass", timeout_s=0.5)
    assert r.status == "timeout"


def test_default_timeout_applies(sandbox_pool):
    r = sandbox_pool.run("import time; time.sleep(30)")  # settings timeout_s = 2
    assert r.status == "timeout" and 1.9 <= r.duration_s < 5


def test_requested_timeout_is_capped(sandbox_pool):
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_CPU)[0])"
    assert int(sandbox_pool.run(code, timeout_s=1e9).stdout) <= 62  # max_timeout_s 60 + 1, plus CPU already used


def test_cpu_rlimit_sends_sigxcpu(sandbox_pool):
    # The cell lowers its own CPU limit below the wall deadline: the kernel's SIGXCPU is reported as a timeout.
    r = sandbox_pool.run("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1, 2))\nwhile True:\n    pass",
                         timeout_s=10)
    assert (r.status, r.exit_code) == ("timeout", -24) and r.duration_s < 8


def test_rlimits_are_set(sandbox_pool, sandbox_settings):
    r = sandbox_pool.run("import resource as r\nfor n in ('AS', 'FSIZE', 'NOFILE', 'NPROC', 'CORE'):\n"
                         "    print(n, r.getrlimit(getattr(r, 'RLIMIT_' + n)))")
    mb = 1024 * 1024
    s = sandbox_settings
    assert r.stdout.splitlines() == [
        f"AS ({s.memory_mb * mb}, {s.memory_mb * mb})", f"FSIZE ({s.max_file_size_mb * mb}, {s.max_file_size_mb * mb})",
        f"NOFILE ({s.max_open_files}, {s.max_open_files})", f"NPROC ({s.max_processes}, {s.max_processes})", "CORE (0, 0)"]


def test_memory_bomb(sandbox_pool):
    r = sandbox_pool.run("x = bytearray(3 * 1024 ** 3)")
    assert (r.status, r.exit_code) == ("memory", 1)
    assert r.stderr.startswith("MemoryError at line 1")
    r = sandbox_pool.run("import numpy as np\na = np.ones((60000, 60000))")
    assert r.status == "memory"


def test_growing_memory_bomb(sandbox_pool):
    # A generous deadline: filling 2 GB on a loaded 2-core machine can take seconds; the cap must win.
    r = sandbox_pool.run("chunks = []\nwhile True:\n    chunks.append(b'x' * 50_000_000)", timeout_s=30)
    assert r.status == "memory"


def test_output_flood_is_killed_while_reading(sandbox_pool):
    started = time.monotonic()
    r = sandbox_pool.run("while True:\n    print('y' * 4096)", timeout_s=10)
    assert r.status == "output_limit"
    assert r.stdout == ("y" * 4096 + "\n")[:1000] and r.stdout_truncated
    assert time.monotonic() - started < 5  # stopped by the byte cap, not by the 10 s deadline


def test_stderr_flood(sandbox_small_pool):
    r = sandbox_small_pool.run("import os\nwhile True:\n    os.write(2, b'e' * 1000)")
    assert r.status == "output_limit" and r.stderr == "e" * 50


def test_file_size_limit(sandbox_pool):
    r = sandbox_pool.run("f = open('big', 'wb')\nf.write(b'0' * (32 * 1024 * 1024))\nf.flush()")
    assert r.status == "error" and "File too large" in r.stderr


def test_open_files_limit(sandbox_pool):
    r = sandbox_pool.run("fs = []\nwhile True:\n    fs.append(open('/dev/null'))")
    assert r.status == "error" and "Too many open files" in r.stderr


def test_scratch_space_is_capped(sandbox_pool):
    # 256 MB tmpfs holds every scratch dir; 15 MB files stay under FSIZE, so the tmpfs cap is what stops it.
    code = ("i = 0\ntry:\n    while True:\n        open(f'f{i}', 'wb').write(b'1' * 15_000_000)\n        i += 1\n"
            "except OSError as e:\n    print(i, e.errno)")
    r = sandbox_pool.run(code, timeout_s=10)
    count, errno_ = map(int, r.stdout.split())
    assert errno_ == 28 and count <= 18  # ENOSPC


def test_fork_bomb_stops_at_the_process_limit(sandbox_pool, sandbox_settings):
    code = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
            "            time.sleep(60)\n            os._exit(0)\n        n += 1\n"
            "except OSError as e:\n    print(n, e.errno)")
    r = sandbox_pool.run(code)
    forked, errno_ = map(int, r.stdout.split())
    assert errno_ == 11 and forked < sandbox_settings.max_processes  # EAGAIN from RLIMIT_NPROC
    leftovers = [p for p in sandbox_pool.settled_processes() if p["role"] not in ("spare", "session")]
    assert leftovers == []


def test_classic_fork_bomb_is_contained(sandbox_pool):
    r = sandbox_pool.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                         timeout_s=1)
    assert r.status in ("timeout", "error")
    assert sandbox_pool.run("print('alive')").stdout == "alive\n"
    assert [p for p in sandbox_pool.settled_processes() if p["role"] not in ("spare", "session")] == []


def test_full_queue_answers_queue_timeout(sandbox_small_pool):
    # one worker, at most two waiting: of six concurrent sleepers, three cannot even queue
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        results = list(ex.map(lambda _: sandbox_small_pool.run("import time; time.sleep(0.3)"), range(6)))
    statuses = [r.status for r in results]
    assert statuses.count("queue_timeout") >= 3
    assert any("queue is full" in r.stderr for r in results)
    assert statuses.count("ok") >= 1


def test_old_queued_call_answers_queue_timeout(sandbox_small_pool):
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        slow = ex.submit(sandbox_small_pool.run, "import time; time.sleep(1.8)")
        time.sleep(0.2)
        waiting = ex.submit(sandbox_small_pool.run, "print('late')")
        r = waiting.result()
        assert r.status == "queue_timeout" and "within 1 s" in r.stderr and r.queue_s >= 0.9
        assert slow.result().ok
    assert sandbox_small_pool.run("print('after')").stdout == "after\n"


def test_a_dead_zygote_is_replaced_and_calls_keep_being_answered():
    import os
    import signal

    from conftest import SyncPool
    from rstar.sandbox.settings import SandboxSettings

    pool = SyncPool(SandboxSettings(workers=1, uid_base=65000, preload=[]))
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            in_flight = ex.submit(pool.run, "import time; time.sleep(5)")
            time.sleep(0.5)
            os.kill(pool.pool._zygote.proc.pid, signal.SIGKILL)  # the bwrap process holding the zygote
            lost = in_flight.result(30)
        assert lost.status == "internal_error" and "restarted" in lost.stderr
        assert pool.run("print('again')").stdout == "again\n"
        assert pool.pool.metrics.zygote_restarts == 1
    finally:
        pool.close()

