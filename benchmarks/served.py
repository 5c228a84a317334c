"""A model served by `rstar serve` as a user starts it: a fresh process on a free port, its own data directory,
its log kept beside the benchmark's other files, stopped (SIGTERM) when the block ends."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.processes import free_port, start_logged


@dataclass(frozen=True)
class Served:
    base_url: str  # http://127.0.0.1:PORT, no /v1
    startup_s: float


@contextmanager
def served(model: str, work_dir: Path, timeout_s: float = 900) -> Iterator[Served]:
    port = free_port()
    log_path = work_dir / f"serve-{re.sub(r'[^A-Za-z0-9_.-]', '_', Path(model).name)}-{port}.log"
    env = {**os.environ, "RSTAR_DATA_DIR": str(work_dir / "data"), "RSTAR_PORT": str(port)}
    started = time.perf_counter()
    server = start_logged([sys.executable, "-m", "rstar.cli", "serve", "--model", model, "--port", str(port)], env, log_path,
                          f"http://127.0.0.1:{port}/health", timeout_s)
    try:
        yield Served(f"http://127.0.0.1:{port}", time.perf_counter() - started)
    finally:
        server.terminate()
        server.wait(60)
