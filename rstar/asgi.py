"""Cancelling a request's work when its HTTP client disconnects, for the API server and the sandbox service.

uvicorn does not cancel a handler whose client left: the handler runs on, and so would its generations or
cells. `cancel_on_disconnect` watches the ASGI receive channel beside the work and cancels the work first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")


async def cancel_on_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Run `work` unless the client disconnects first; then cancel it and raise ClientDisconnected.

    The request body has been read by then, so the next ASGI message can only be the disconnect.
    """
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            # Let its clean-up (engine aborts, sandbox cancellations) finish before answering.
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


class ClientDisconnected(Exception):
    """The client left; nothing is sent back."""
