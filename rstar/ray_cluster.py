"""This process's connection to Ray, shared by everything here that runs on it (sandbox pools, engine replicas).

`join` connects on first use, to the cluster at `address` or to a new local Ray when it is None, and counts its
users; `leave` shuts down a local Ray that `join` started once the last user has left, so that one user closing
(the sandbox pool, say) cannot pull the cluster from under another (the engine replicas). A Ray this process
was already connected to by other code is left as it is.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

# Held around the blocking ray.init and ray.shutdown: in worker threads (join, leave), never on an event loop, or
# by a caller that blocks as it starts anyway (join_blocking, leave_blocking: the trainer's ranks).
_lock = threading.Lock()
_users = 0
_started_here = False


def join_blocking(address: str | None) -> Any:
    import ray

    global _users, _started_here
    with _lock:
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False)
            _started_here = True
        _users += 1
    return ray


def leave_blocking() -> None:
    import ray

    global _users, _started_here
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _started_here:
            ray.shutdown()
            _started_here = False


async def join(address: str | None) -> Any:
    """The `ray` module, connected; call `leave` once when done with it."""
    return await asyncio.to_thread(join_blocking, address)


async def leave() -> None:
    await asyncio.to_thread(leave_blocking)
