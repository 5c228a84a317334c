"""Polling for a condition that another thread or process brings about (an engine going idle, a child exiting)."""

from __future__ import annotations

import time
from typing import Callable


def wait_for(condition: Callable[[], object], timeout_s: float = 30, failure: str = "condition not reached in time") -> None:
    """Return once `condition()` is true; fail the test with `failure` after `timeout_s` seconds."""
    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, f"{failure} ({timeout_s:g} s)"
        time.sleep(0.1)
