"""The OpenAI API's routes (`router`), thin over the endpoint services (`serving_*.py`), and how their answers
go out over HTTP: a non-streaming answer is cancelled when its client leaves, an SSE stream ends by the
request's deadline whether or not its client reads. The app that mounts this router is built in
`rstar/app.py`; the services are on `app.state` (`lifespan.serving_lifespan`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message, Send

import rstar
from rstar.asgi import ClientDisconnected, cancel_on_disconnect
from rstar.server.auth import API_KEY, key_owner
from rstar.server.engine import EngineFailed
from rstar.server.errors import APIError, error_body
from rstar.server.limits import AdmittedStream, RequestTimeout
from rstar.server.metrics import CONTENT_TYPE, ServerMetrics
from rstar.server.replicas import ReplicatedEngine
from rstar.server.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, ModelCard, ModelList, TokenizeRequest
from rstar.server.schemas_responses import ResponsesRequest
from rstar.server.serving_base import Serving, sse
from rstar.server.serving_chat import ChatService
from rstar.server.serving_completions import CompletionService, detokenize
from rstar.server.serving_responses import ResponsesService

log = logging.getLogger("rstar.server")

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 while the engine serves ("degraded" when only the sandbox is down); 503 once the engine cannot,
    so an orchestrator restarts the process (vLLM refuses every request after its EngineCore died)."""
    serving: Serving = request.app.state.serving
    try:
        sandbox = await serving.sandbox.health()
    except Exception as exc:  # an unreachable sandbox service is a degraded server, not a failed probe
        sandbox = {"status": "unreachable", "detail": str(exc)}
    engine = serving.engine.stats()
    status = "failed" if engine.failed else "ok" if sandbox.get("status") == "ok" else "degraded"
    admission = serving.admission
    body = {
        "status": status,
        "model": request.app.state.model_name,
        "engine": engine.__dict__,
        "admission": {"running": admission.running, "waiting": admission.waiting, "max_running": admission.max_running, "max_waiting": admission.max_waiting},
        "sandbox": sandbox,
    }
    if isinstance(serving.engine, ReplicatedEngine):
        body["replicas"] = serving.engine.replicas()
    return JSONResponse(body, status_code=503 if engine.failed else 200)


@router.get("/version")
async def version() -> dict:
    return {"version": rstar.__version__}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    serving = request.app.state.serving
    replicas = await serving.engine.replica_metrics() if isinstance(serving.engine, ReplicatedEngine) else b""
    return Response(serving.metrics.render(replicas), media_type=CONTENT_TYPE)


@router.get("/v1/models", dependencies=API_KEY)
async def list_models(request: Request) -> ModelList:
    serving = request.app.state.serving
    return ModelList(data=[ModelCard(id=request.app.state.model_name, max_model_len=serving.engine.max_model_len, sampling_defaults=serving.sampling_defaults)])


@router.post("/v1/chat/completions", dependencies=API_KEY)
async def chat_completions(body: ChatCompletionRequest, request: Request):
    chat: ChatService = request.app.state.chat
    scope = {"owner": key_owner(request), "containers": request.app.state.containers}
    return await _answer(request, body, functools.partial(chat.stream, **scope), functools.partial(chat.complete, **scope))


@router.post("/v1/completions", dependencies=API_KEY)
async def completions(body: CompletionRequest, request: Request):
    service: CompletionService = request.app.state.completions
    return await _answer(request, body, service.stream, service.complete)


@router.post("/v1/responses", dependencies=API_KEY)
async def responses(body: ResponsesRequest, request: Request):
    service: ResponsesService = request.app.state.responses
    scope = {"containers": request.app.state.containers, "files": request.app.state.files, "owner": key_owner(request)}
    return await _answer(request, body, functools.partial(service.stream, **scope), functools.partial(service.create, **scope))


@router.post("/tokenize", dependencies=API_KEY)
async def tokenize_route(body: TokenizeRequest, request: Request) -> dict:
    return await request.app.state.chat.tokenize(body)


@router.post("/detokenize", dependencies=API_KEY)
async def detokenize_route(body: DetokenizeRequest, request: Request) -> dict:
    return detokenize(request.app.state.serving, body)


async def _answer(request: Request, body: Any, streamed: Callable[..., Awaitable[AdmittedStream]], whole: Callable[..., Awaitable[Any]]):
    """`body`'s answer: an SSE stream when it asks for one, else the whole answer unless its client leaves first."""
    received_at = time.monotonic()
    if body.stream:
        return _event_stream(request, await streamed(body, received_at))
    return await _unless_disconnected(request, whole(body, received_at))


async def _unless_disconnected(request: Request, work: Awaitable):
    """A non-streaming answer whose client leaves is cancelled: its generations and tool runs stop."""
    try:
        return await cancel_on_disconnect(request.receive, work)
    except ClientDisconnected:
        request.app.state.serving.metrics.client_disconnects.inc()
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it


def _event_stream(request: Request, events: AdmittedStream) -> StreamingResponse:
    serving: Serving = request.app.state.serving
    return _EventStream(events, serving.metrics, serving.settings.api.request_timeout_s, serving.settings.api.write_timeout_s)


class _EventStream(StreamingResponse):
    """An SSE response that holds its generations and admission slots no longer than the request's deadline,
    whether or not its client reads, and closes its events however it ends.

    Between events the events keep the deadline themselves (and end with an error event). While a write
    waits, this does: uvicorn's `send` waits as long as the socket's buffers are full, which for a client
    that stopped reading is forever. A write waits at most `write_timeout_s`, and one begun before the
    deadline no later than the deadline."""

    def __init__(self, events: AdmittedStream, metrics: ServerMetrics, timeout_s: float, write_timeout_s: float):
        self.events, self.metrics = events, metrics
        self.timeout_s, self.write_timeout_s = timeout_s, write_timeout_s
        self.deadline = asyncio.get_running_loop().time() + timeout_s
        self.ended = False  # the last byte went out, or the server cut the stream; not the client leaving
        super().__init__(_guard_stream(events), media_type="text/event-stream")

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.events.aclose()
            if not self.ended:
                self.metrics.client_disconnects.inc()

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(functools.partial(self._write, send))
        except _WriteTimeout as stalled:
            # Now, not whenever the client reads again: the generations stop and the slots return.
            await self.events.aclose()
            if stalled.at_deadline:
                await self._tell_deadline(send)
            else:
                log.warning("a stream's client took no bytes for %g s (api.write_timeout_s); the stream is cut", self.write_timeout_s)
        self.ended = True

    async def _tell_deadline(self, send: Send) -> None:
        """The error event a reading client gets at the deadline, if this one takes it in time."""
        event = sse_error(RequestTimeout(self.timeout_s).message, 504).encode()
        try:
            await self._write(send, {"type": "http.response.body", "body": event, "more_body": True})
            await self._write(send, {"type": "http.response.body", "body": b"", "more_body": False})
        except _WriteTimeout:
            log.warning("a stream's client took no bytes at the request's deadline; the stream is cut")

    async def _write(self, send: Send, message: Message) -> None:
        now = asyncio.get_running_loop().time()
        at_deadline = now < self.deadline < now + self.write_timeout_s
        try:
            async with asyncio.timeout_at(self.deadline if at_deadline else now + self.write_timeout_s):
                await send(message)
        except TimeoutError:
            raise _WriteTimeout(at_deadline) from None


class _WriteTimeout(Exception):
    """A write the client did not take in time; `at_deadline`: the request's deadline cut it."""

    def __init__(self, at_deadline: bool):
        super().__init__()
        self.at_deadline = at_deadline


async def _guard_stream(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Once the 200 and the first bytes are out, an error can only travel as an SSE event. A client that
    leaves closes this generator, and closing `events` aborts the generations and tool runs behind it."""
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                yield event
    except APIError as exc:  # a limit reached mid-stream (the request timeout)
        yield sse_error(exc.message, exc.status)
    except EngineFailed as exc:
        yield sse_error(f"engine unavailable: {exc}", 503)
    except Exception as exc:
        log.exception("stream failed")
        yield sse_error(f"{type(exc).__name__}: {exc}", 500)


def sse_error(message: str, status: int) -> str:
    """An error after the stream began: OpenAI clients read an `error` event and raise."""
    return sse(json.dumps(error_body(status, message)))
