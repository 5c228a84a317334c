"""Helpers for tests that start rstar as a user would: a free port, starting a server and waiting until it
serves (a CLI in its own process, or an ASGI app in a thread), the browser the tests drive, and clearing what a
killed engine leaves in shared memory."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from rstar.orphan_guard import SEGMENT_PREFIX, SHM, unlink_unused_shared_memory


# Debian's chromium (Playwright never downloads one here), headless with no GPU and no network beyond loopback.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_in_thread(app) -> tuple[str, Callable[[], None]]:
    """Serve an ASGI app on a free loopback port from a thread: its base URL, and how to stop it."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        assert thread.is_alive(), "the server exited during start-up"
        assert time.time() < deadline, "the server did not start in 60 s"
        time.sleep(0.05)

    def stop() -> None:
        server.should_exit = True
        thread.join(30)

    return f"http://127.0.0.1:{sock.getsockname()[1]}", stop


def wait_until_serving(process: subprocess.Popen, url: str, log_path: Path, timeout_s: float) -> None:
    """Poll `url` until it answers 200; fail with the process's log if it exits or the time runs out."""
    deadline = time.time() + timeout_s
    while True:
        assert process.poll() is None, f"{process.args} exited: {log_path.read_text()[-3000:]}"
        assert time.time() < deadline, f"{url} did not answer in {timeout_s:.0f} s: {log_path.read_text()[-3000:]}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def start_logged(command: list[str], env: dict, log_path: Path, url: str, timeout_s: float = 300) -> subprocess.Popen:
    """Start a CLI server as a user would, its output in `log_path`, and wait until `url` answers."""
    log = open(log_path, "w")
    # Ctrl-C as a terminal delivers it: a test run started in the background of a non-interactive shell
    # inherits SIGINT ignored, and Python keeps it ignored, so the server could not stop the way users stop it.
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log.close()  # the child holds its own copy
    wait_until_serving(process, url, log_path, timeout_s=timeout_s)
    return process


def remove_orphaned_shared_memory(since: float) -> list[str]:
    """Unlink the POSIX shared-memory segments vLLM made (/dev/shm/psm_*) since `since` (a time.time()) that no
    live process maps or holds open: what an engine killed together with its orphan guard leaves behind. They are RAM (tmpfs)
    until unlinked, so a suite that kills engines on purpose would otherwise shrink the memory of every later run."""
    shm = Path(SHM)
    return unlink_unused_shared_memory(p.name for p in shm.glob(SEGMENT_PREFIX + "*") if p.stat().st_mtime >= since)
