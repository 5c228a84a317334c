"""Cells in a container (issue 26): they work in its data dir, seen at /mnt/data, keep their globals, get the
container's memory cap, and cannot reach another container's files; bad requests are refused."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from tests.unit.conftest import SyncPool

A, B, C = ("cntr_" + letter * 32 for letter in "abc")


@pytest.fixture(scope="module")
def containers(tmp_path_factory):
    from rstar.sandbox.settings import SandboxSettings

    root = tmp_path_factory.mktemp("containers")
    for container in (A, B, C):
        (root / container / "data").mkdir(parents=True)
    (root / A / "data" / "in.csv").write_text("x\n1\n2\n39\n")
    pool = SyncPool(SandboxSettings(workers=1, spare_cells=1, max_sessions=3, timeout_s=5.0, uid_base=62000, containers_dir=str(root)))
    yield pool, root
    pool.close()


def test_a_container_s_cells_work_in_its_directory_at_mnt_data_and_keep_their_globals(containers):
    pool, root = containers
    first = pool.run("import os, csv\ntotal = sum(int(r['x']) for r in csv.DictReader(open('/mnt/data/in.csv')))\n"
                     "open('/mnt/data/out.txt', 'w').write(str(total))\nprint(total, sorted(os.listdir('.')))", container_id=A)
    assert (first.status, first.stdout) == ("ok", "42 ['in.csv', 'out.txt']\n"), first
    assert (root / A / "data" / "out.txt").read_text() == "42"
    again = pool.run("print(total * 2)", container_id=A)
    assert again.stdout == "84\n" and again.session_new is False


def test_another_container_s_files_are_out_of_reach(containers):
    pool, root = containers
    (root / A / "data" / "secret.txt").write_text("A's")
    code = ("import os\nprint(os.listdir('/mnt/data'))\n"
            f"for path in ('/var/lib/rstar/containers/{A}/data/secret.txt', '/var/lib/rstar/containers'):\n"
            "    try:\n        print(open(path).read() if path.endswith('.txt') else os.listdir(path))\n"
            "    except OSError as exc:\n        print(type(exc).__name__)")
    result = pool.run(code, container_id=B)
    assert result.stdout == "[]\nPermissionError\nPermissionError\n", result
    plain = pool.run("import os\nprint(os.path.exists('/mnt/data/secret.txt'))")  # a cell in no container has no /mnt/data
    assert plain.stdout == "False\n"


def test_the_container_s_memory_cap_applies_to_its_cells(containers):
    pool, _ = containers
    big = pool.run("x = bytearray(700 * 2**20)\nprint('allocated')", container_id=C, memory_mb=256)
    assert big.status == "memory", big
    small = pool.run("y = bytearray(100 * 2**20)\nprint('allocated')", container_id=C)
    assert small.stdout == "allocated\n", small


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"container_id": "cntr_../../etc"}, "container_id"),
        ({"container_id": A, "session_id": "s"}, "not both"),
        ({"memory_mb": 512}, "needs container_id"),
        ({"container_id": "cntr_" + "d" * 32}, "no directory"),
    ],
)
def test_bad_container_requests_are_refused(containers, fields, says):
    pool, _ = containers
    result = pool.run("print(1)", **fields)
    assert result.status == "invalid_input" and says in result.stderr, result


def test_without_containers_dir_no_cell_runs_in_a_container(sandbox_small_pool):
    result = sandbox_small_pool.run("print(1)", container_id=A)
    assert result.status == "invalid_input" and "containers_dir" in result.stderr


def test_a_closed_container_session_gives_its_files_back_to_the_zygote(containers):
    pool, root = containers
    pool.run("open('/mnt/data/kept.txt', 'w').write('kept')", container_id=B)
    pool.call(pool.pool.close_session(B))
    pool.run("print(1)")  # the zygote has read the close by the time it answers this
    kept = root / B / "data" / "kept.txt"
    assert kept.read_text() == "kept" and os.stat(kept).st_uid == os.getuid() and os.stat(root / B / "data").st_mode & 0o077 == 0


def test_closing_a_container_s_session_while_its_cell_runs_lets_the_cell_finish_first(containers):
    """The cell's caller gets the cell's own result, not the zygote's stop."""
    pool, _ = containers

    async def run_and_close():
        running = asyncio.ensure_future(pool.pool.run({"code": "import time\ntime.sleep(0.5)\nprint('done')", "container_id": C}))
        await asyncio.sleep(0.2)
        await pool.pool.close_session(C)
        return await running

    started, restarts = time.monotonic(), pool.pool.metrics.zygote_restarts
    result = pool.call(run_and_close())
    assert (result.status, result.stdout) == ("ok", "done\n") and time.monotonic() - started < 3, result
    assert pool.pool.metrics.zygote_restarts == restarts
    assert pool.run("print(1)", container_id=C).session_new is True


def test_a_close_that_reaches_the_zygote_while_a_cell_runs_answers_that_cell(containers):
    """What the pool's wait keeps from happening, should a close come another way: the cell is answered at once,
    naming the close, and the zygote goes on."""
    pool, _ = containers

    async def run_and_close_behind_the_pool():
        running = asyncio.ensure_future(pool.pool.run({"code": "import time\ntime.sleep(3)\nprint('done')", "container_id": C}))
        await asyncio.sleep(0.5)
        await (await pool.pool._ensure_zygote()).send({"op": "close_session", "session": C})
        return await running

    started, restarts = time.monotonic(), pool.pool.metrics.zygote_restarts
    result = pool.call(run_and_close_behind_the_pool())
    assert result.status == "internal_error" and "session was closed" in result.stderr and time.monotonic() - started < 2.5, result
    assert pool.pool.metrics.zygote_restarts == restarts
    assert pool.run("print(1)", container_id=C).session_new is True


def test_a_fresh_interpreter_finds_its_new_container_s_directory_open_to_it(containers):
    """The server makes a container's directory 0700 and its own; the sandbox gives it to the interpreter's uid.
    Given after the fork, the child could reach the directory first and fail to start (about 1 first cell in 60
    here), and its reason was drained with the pipes of a session about to run a cell: a silent exit 70."""
    pool, root = containers
    statuses = []
    for i in range(40):
        container = f"cntr_{i:032x}"
        (root / container / "data").mkdir(parents=True, mode=0o700)
        result = pool.run("print(len(__import__('os').listdir('/mnt/data')))", container_id=container)
        statuses.append((result.status, result.stderr[-200:]) if not result.ok else "ok")
    assert statuses == ["ok"] * 40
