"""The zygote's safety net behind killpg, run on the host: kill processes of cell uids outside the live groups."""

from __future__ import annotations

import os
import subprocess

import pytest

from rstar.sandbox import procs

UID_BASE = 67000  # no other test uses these uids, so the sweep sees only this test's processes


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"], user=UID_BASE + 1, group=UID_BASE + 1, process_group=0)
    yield proc
    proc.kill()
    proc.wait()


def test_process_group_reads_the_group_of_a_live_process_and_none_once_gone(sleeper):
    assert procs.process_group(sleeper.pid) == sleeper.pid
    assert procs.process_group(os.getpid()) == os.getpgrp()
    sleeper.kill()
    sleeper.wait()
    assert procs.process_group(sleeper.pid) is None


def test_kill_strays_spares_live_groups_and_kills_the_rest(sleeper):
    assert procs.kill_strays(UID_BASE, 4, {sleeper.pid}) == []
    assert sleeper.poll() is None
    assert procs.kill_strays(UID_BASE + 2, 2, set()) == []  # another uid range: not ours to kill
    assert procs.kill_strays(UID_BASE, 4, {12345}) == [sleeper.pid]
    assert sleeper.wait(timeout=5) == -9
