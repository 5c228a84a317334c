"""A container's disk caps hold against its code (issue 26): code that writes past max_files or max_bytes is
stopped, during a cell or between cells, and what it wrote since its latest cell began is removed; what was there
before stays. Without the watchdog these cells write until their timeout and every file stays on the host disk."""

from __future__ import annotations

import os
import time

import pytest

from rstar.sandbox import container_disk
from tests.unit.conftest import SyncPool

FLOOD, BIG, LATER, FULL = ("cntr_" + letter * 32 for letter in "1234")
MAX_FILES, MAX_BYTES = 6, 1 << 20


# ------------------------------------------------------------------------------------- the measure, pure
def test_measure_counts_entries_at_any_depth_a_hard_link_once_and_a_sparse_file_by_its_size(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 1000)
    os.link(tmp_path / "a", tmp_path / "a_again")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "b").write_bytes(b"y" * 10)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(5 << 20)
    usage = container_disk.measure(str(tmp_path), container_disk.Caps(100, 10 << 20))
    assert usage.entries == 6
    assert 1010 + (5 << 20) <= usage.bytes < 1010 + (5 << 20) + 3 * 4096  # blocks round a small file up
    assert usage.over(container_disk.Caps(5, 10 << 20)) == "more than 5 files (max_files)"
    assert "max_bytes" in usage.over(container_disk.Caps(100, 1 << 20))
    assert usage.over(container_disk.Caps(6, 6 << 20)) is None


def test_measure_stops_counting_just_past_the_cap(tmp_path):
    for i in range(50):
        (tmp_path / f"f{i}").touch()
    assert container_disk.measure(str(tmp_path), container_disk.Caps(9, 1)).entries == 10


def test_remove_new_keeps_what_was_there_and_what_another_uid_wrote(tmp_path):
    (tmp_path / "old").write_text("old")
    (tmp_path / "olddir").mkdir()
    before = container_disk.measure(str(tmp_path), container_disk.Caps(100, 1 << 20))
    (tmp_path / "new").write_text("new")
    (tmp_path / "olddir" / "new_inside").write_text("new")
    (tmp_path / "newdir" / "sub").mkdir(parents=True)
    (tmp_path / "newdir" / "sub" / "f").write_text("new")
    (tmp_path / "upload").write_text("the server's")
    os.chown(tmp_path / "upload", 4242, 4242)
    assert container_disk.remove_new(str(tmp_path), before, owner=os.getuid()) == 3
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["old", "olddir", "upload"]


# ---------------------------------------------------------------------------------- in the real sandbox
@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    from rstar.sandbox.settings import SandboxSettings

    root = tmp_path_factory.mktemp("containers")
    for container in (FLOOD, BIG, LATER, FULL):
        (root / container / "data").mkdir(parents=True)
        (root / container / "data" / "upload.csv").write_text("x\n1\n")
    pool = SyncPool(SandboxSettings(workers=1, spare_cells=1, max_sessions=4, timeout_s=20.0, uid_base=62100, containers_dir=str(root),
                                    container_max_files=MAX_FILES, container_max_bytes=MAX_BYTES))
    yield pool, root
    pool.close()


def names(root, container) -> list[str]:
    return sorted(p.name for p in (root / container / "data").iterdir())


def test_a_cell_writing_file_after_file_is_stopped_at_max_files_and_its_files_removed(capped):
    pool, root = capped
    assert pool.run("open('/mnt/data/earlier.txt', 'w').write('kept')", container_id=FLOOD).ok
    flood = pool.run("import itertools\nfor i in itertools.count():\n    open(f'/mnt/data/f{i}', 'w').write('x')", container_id=FLOOD)
    assert flood.status == "output_limit", flood
    assert "max_files" in flood.stderr and "removed" in flood.stderr
    assert flood.duration_s < 10  # stopped by the watchdog, not the 20 s timeout
    assert names(root, FLOOD) == ["earlier.txt", "upload.csv"]
    again = pool.run("print(open('/mnt/data/earlier.txt').read())", container_id=FLOOD)
    assert again.stdout == "kept\n" and again.session_new is True  # the flooding interpreter is gone


def test_a_cell_writing_past_max_bytes_is_stopped_though_each_file_is_small(capped):
    pool, root = capped
    big = pool.run("for i in range(4):\n    open(f'/mnt/data/part{i}', 'wb').write(bytes(400_000))\nimport time\ntime.sleep(15)",
                   container_id=BIG)
    assert big.status == "output_limit" and "max_bytes" in big.stderr, big
    assert names(root, BIG) == ["upload.csv"]


def test_code_left_writing_after_its_cell_answered_is_stopped_too(capped):
    pool, root = capped
    started = pool.run("import threading, time\n"
                       "def fill():\n    for i in range(100):\n        open(f'/mnt/data/late{i}', 'w').write('x'); time.sleep(0.02)\n"
                       "threading.Thread(target=fill).start()\nprint('started')", container_id=LATER)
    assert started.stdout == "started\n", started
    time.sleep(3)  # the thread would have written its 100 files in 2 s
    assert names(root, LATER) == ["upload.csv"]
    assert pool.run("print(1)", container_id=LATER).session_new is True


def test_a_container_already_over_its_caps_runs_no_code(capped):
    pool, root = capped
    for i in range(MAX_FILES):
        (root / FULL / "data" / f"u{i}").write_text("u")
    full = pool.run("print(1)", container_id=FULL)
    assert full.status == "output_limit" and "max_files" in full.stderr and "delete files" in full.stderr, full
    assert len(names(root, FULL)) == MAX_FILES + 1  # nothing of the container's own was removed


def test_rstar_serve_hands_the_api_s_container_caps_to_the_sandbox():
    from rstar.config import Settings

    settings = Settings(containers={"max_files": 7, "max_bytes": 12345})
    assert (settings.sandbox.container_max_files, settings.sandbox.container_max_bytes) == (7, 12345)
