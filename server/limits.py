"""Request limits: body size (413), a bounded admission queue per engine (429) and per-request deadlines (504).

Nothing here queues without bound: the engine would accept every request and schedule it eventually, so
the admission queue is where overload turns into a quick 429 with Retry-After instead of ever-longer waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rstar.server.errors import APIError, error_body

T = TypeVar("T")


class Overloaded(APIError):
    def __init__(self, message: str, retry_after_s: int):
        super().__init__(429, message, code="server_overloaded", headers={"Retry-After": str(retry_after_s)})


class RequestTimeout(APIError):
    def __init__(self, seconds: float):
        super().__init__(504, f"the request did not finish within {seconds:g} s (server setting api.request_timeout_s)", code="timeout")


class Admission:
    """At most `max_running` generations at once; at most `max_waiting` requests waiting for room.

    A request asks for as many slots as it has choices (`n`), since each is one engine sequence.
    """

    def __init__(self, max_running: int, max_waiting: int, wait_timeout_s: float, retry_after_s: int):
        self.max_running, self.max_waiting = max_running, max_waiting
        self.wait_timeout_s, self.retry_after_s = wait_timeout_s, retry_after_s
        self.running = 0
        self.waiting = 0
        self._room = asyncio.Condition()

    async def acquire(self, slots: int, patient: bool = False) -> None:
        """Take `slots`, waiting for room up to wait_timeout_s (then 429). `patient`: the server's own work (RL
        rollouts), which waits as long as it takes, behind every waiting request, and is not counted against
        max_waiting, so it never turns an API client away."""
        if slots > self.max_running:
            raise APIError(400, f"n={slots} exceeds the {self.max_running} generations this server runs at once", "n")
        async with self._room:
            if self.running + slots <= self.max_running and not self.waiting:
                self.running += slots
                return
            if patient:
                await self._room.wait_for(lambda: self.running + slots <= self.max_running and not self.waiting)
                self.running += slots
                return
            if self.waiting >= self.max_waiting:
                raise Overloaded(f"the server is at capacity ({self.running} running, {self.waiting} waiting); retry later", self.retry_after_s)
            self.waiting += 1
            try:
                await asyncio.wait_for(self._room.wait_for(lambda: self.running + slots <= self.max_running), self.wait_timeout_s)
            except asyncio.TimeoutError:
                raise Overloaded(f"no room within {self.wait_timeout_s:g} s ({self.running} running); retry later", self.retry_after_s) from None
            finally:
                self.waiting -= 1
            self.running += slots

    async def release(self, slots: int) -> None:
        async with self._room:
            self.running -= slots
            self._room.notify_all()

    @contextlib.asynccontextmanager
    async def slots(self, count: int, patient: bool = False):
        await self.acquire(count, patient)
        try:
            yield
        finally:
            await self.release(count)


class AdmittedGenerations:
    """An engine whose generations take admission slots as API requests do, for work the server starts itself
    (RL rollouts): at most `share` generations at once, each waiting patiently for its slot, so API clients
    keep the rest of the running slots and go first when both wait. Everything else is the engine's."""

    # The engine answers the API throughout a server-hosted run, so a colocated trainer must never put it to sleep.
    sleep_unavailable = "the engine serves this server's API during the run"

    def __init__(self, engine: Any, admission: Admission, share: int):
        self._engine, self._admission, self._share = engine, admission, asyncio.Semaphore(share)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, prompt_ids, options, request_id=None) -> AsyncIterator:
        async with self._share, self._admission.slots(1, patient=True):
            async with contextlib.aclosing(self._engine.generate(prompt_ids, options, request_id)) as deltas:
                async for delta in deltas:
                    yield delta


class AdmittedStream:
    """SSE events that hold admission slots until they end or are closed.

    A stream's slots are taken before its response starts (so a full server answers 429, not a broken
    stream); the response closes this object whatever happens, even when the client left before the
    first event and the events never started, which an async generator's own `finally` would miss."""

    def __init__(self, admission: Admission, slots: int, events: AsyncIterator[str]):
        self.admission, self.slots, self.events = admission, slots, events
        self._held = True

    def __aiter__(self) -> "AdmittedStream":
        return self

    async def __anext__(self) -> str:
        try:
            return await anext(self.events)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        try:
            await self.events.aclose()
        finally:
            if self._held:
                self._held = False
                await self.admission.release(self.slots)


async def with_deadline(events: AsyncIterator[T], timeout_s: float) -> AsyncIterator[T]:
    """Pass `events` through until `timeout_s` after the first one was asked for; then close them and raise
    RequestTimeout. One deadline for the whole run, so time the consumer spends between events counts too."""
    async with contextlib.aclosing(events):
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    item = await anext(events)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise RequestTimeout(timeout_s) from None
            yield item


@dataclass(frozen=True)
class UploadRoute:
    """A route whose body is a file upload: it may carry the file's cap (`setting`) plus the multipart framing."""

    path: re.Pattern
    file_bytes: int
    setting: str

    FRAMING: ClassVar[int] = 64 * 1024

    @property
    def max_bytes(self) -> int:
        return self.file_bytes + self.FRAMING


class BodySizeLimit:
    """ASGI middleware: 413 for a body over `max_bytes`, from Content-Length before reading, else once the
    chunks read so far exceed it. The body is read here (the JSON routes read it whole anyway) and handed
    on; later `receive` calls reach the client's connection, so disconnects are still seen. A file upload
    (a POST to one of `uploads`) may carry its route's `max_bytes` instead, and the upload route checks the
    file's own caps."""

    def __init__(self, app: ASGIApp, max_bytes: int, uploads: Sequence[UploadRoute] = ()):
        self.app, self.max_bytes, self.uploads = app, max_bytes, uploads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "DELETE"):
            return await self.app(scope, receive, send)
        upload = next((route for route in self.uploads if route.path.fullmatch(scope["path"])), None)
        limit, setting = (upload.max_bytes, upload.setting) if upload and upload.max_bytes > self.max_bytes else (self.max_bytes, "api.max_body_bytes")
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await _reject(send, limit, setting)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left while sending
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return await _reject(send, limit, setting)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _reject(send: Send, limit: int, setting: str) -> None:
    message = f"request body exceeds {limit} bytes (server setting {setting})"
    body = json.dumps(error_body(413, message, code="body_too_large")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
