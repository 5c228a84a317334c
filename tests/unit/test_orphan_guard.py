"""The orphan guard: what a process started dies with it, however it dies."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time

from rstar.orphan_guard import EXIT_WAIT_S, POLL_S, descendants, kill_if_unchanged, running, start_time, still_seen
from tests.waiting import wait_for

# An owner that starts its guard, maps a shared-memory segment named as vLLM's are, then forks a child (as vLLM
# forks its engine) that keeps the mapping and sleeps on; it reports the child and the segment.
OWNER = """
import mmap, os, time
from rstar.orphan_guard import guard_this_process
guard_this_process()
name = f"psm_guardtest_{os.getpid()}"
fd = os.open("/dev/shm/" + name, os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, 1 << 20)
segment = mmap.mmap(fd, 1 << 20)
os.close(fd)
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
print(child, name, flush=True)
time.sleep(600)
"""


def test_a_killed_owners_forked_child_is_killed_by_its_guard():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        child, segment = owner.stdout.readline().split()
        assert os.path.exists(f"/dev/shm/{segment}")
        time.sleep(POLL_S * 2.5)  # the guard has seen the child by now
        os.kill(owner.pid, signal.SIGKILL)  # the owner alone, as the OOM killer picks one process
        owner.wait(10)
        wait_for(lambda: not running(int(child)), timeout_s=POLL_S * 5, failure="the orphaned child outlived its owner")
        wait_for(lambda: not os.path.exists(f"/dev/shm/{segment}"), timeout_s=5,
                 failure="the killed processes' shared memory was left in /dev/shm")
        # The guard, the last to hold the owner's stderr, says what it did and ends (a timeout, not a hang, if not).
        _, stderr = owner.communicate(timeout=EXIT_WAIT_S + 5)
        assert f"process {owner.pid} ended; killed what it left: 1 process (all gone after" in stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(owner.pid, signal.SIGKILL)  # the child too, should the guard have failed
        for leftover in glob.glob(f"/dev/shm/psm_guardtest_{owner.pid}"):
            os.unlink(leftover)


def test_only_the_process_that_was_seen_is_killed():
    # Pids are reused: a pid whose process started at another time than the one seen is someone else's.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        started = start_time(bystander.pid)
        assert kill_if_unchanged({bystander.pid: started - 1}) == []
        assert bystander.poll() is None
        assert kill_if_unchanged({bystander.pid: started}) == [bystander.pid]
        assert bystander.wait(10) == -signal.SIGKILL
    finally:
        bystander.kill()
        bystander.wait()


# An owner whose child starts a grandchild and then exits: the grandchild goes to init (or a subreaper), out of
# the owner's tree, while the owner lives on (as a vLLM worker does when its engine core ends first).
DETACHING_OWNER = """
import os, time
from rstar.orphan_guard import guard_this_process
guard_this_process()
if os.fork() == 0:
    grandchild = os.fork()
    if grandchild == 0:
        time.sleep(600)
        os._exit(0)
    print(grandchild, flush=True)
    time.sleep(3)  # the guard sees the grandchild under the owner meanwhile
    os._exit(0)
time.sleep(600)
"""


def test_a_process_that_left_the_owners_tree_is_still_killed_with_it():
    owner = subprocess.Popen([sys.executable, "-c", DETACHING_OWNER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        grandchild = int(owner.stdout.readline())
        wait_for(lambda: grandchild not in descendants(owner.pid), timeout_s=10, failure="the grandchild never left the owner's tree")
        time.sleep(POLL_S * 2.5)  # the guard has looked again since: the grandchild is no longer under the owner
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        wait_for(lambda: not running(grandchild), timeout_s=POLL_S * 5, failure="the process that left the tree outlived its owner")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(owner.pid, signal.SIGKILL)  # the grandchild kept the owner's process group


def test_a_seen_process_is_dropped_once_its_pid_is_someone_elses():
    def stat(parent: int, started: int) -> list[bytes]:
        return [b"S", str(parent).encode()] + [b"0"] * 17 + [str(started).encode()]

    owner = 100
    table = {owner: stat(1, 5), 101: stat(owner, 10), 102: stat(1, 20), 103: stat(1, 31)}
    seen = {101: 10, 102: 20, 103: 30, 104: 40}  # 102 went to init; 103's pid is now another process; 104 ended
    assert still_seen(seen, owner, table) == {101: 10, 102: 20}
