"""Temp directories of killed processes are removed by the next process of their kind, and nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from rstar.process_temp import owned_temp_dir, remove_orphans

PREFIX = "rstar-test-kind-"


def ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_killed_process_dir_is_removed_and_the_living_ones_are_kept(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphan = tmp_path / f"{PREFIX}{ended_pid()}-abc"
        living = tmp_path / f"{PREFIX}{sleeper.pid}-abc"
        mine = tmp_path / f"{PREFIX}{os.getpid()}-abc"
        unnamed = tmp_path / f"{PREFIX}abc"  # no pid: not made here
        other_kind = tmp_path / f"rstar-other-{ended_pid()}-abc"
        kept = [living, mine, unnamed, other_kind]
        for directory in (orphan, *kept):
            directory.mkdir()
            (directory / "socket").touch()
        if os.geteuid() == 0:  # only root can make a directory that another user owns
            others = tmp_path / f"{PREFIX}{ended_pid()}-other-user"
            others.mkdir()
            os.chown(others, 54321, 54321)
            kept.append(others)
        assert remove_orphans(PREFIX, tmp_path) == [orphan]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_new_directory_is_named_for_its_process_and_sweeps_first(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphan = tmp_path / f"{PREFIX}{ended_pid()}-abc"
    orphan.mkdir()
    directory = owned_temp_dir(PREFIX)
    assert directory.name.startswith(str(tmp_path / f"{PREFIX}{os.getpid()}-"))
    assert not orphan.exists()
    directory.cleanup()
    assert list(tmp_path.iterdir()) == []
