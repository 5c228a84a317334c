"""The HTTP app: thin routes over the services, OpenAI-shaped errors, engine and sandbox lifetime.

`create_app` takes an engine factory (and optionally a sandbox factory) so tests can run the same app on a
scripted engine; `rstar serve` passes one that starts vLLM. Serving logic lives in `serving_*.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import rstar
from rstar.asgi import ClientDisconnected, cancel_on_disconnect
from rstar.config import Settings
from rstar.network import host_name, is_loopback
from rstar.sandbox.clients import SandboxClient, connect
from rstar.server.chat_template import choose_template
from rstar.server.conversations import ConversationStore
from rstar.server.db import close_database, open_database
from rstar.server.engine import EngineFailed, TokenEngine
from rstar.server.errors import APIError, error_body, install_error_handlers
from rstar.server.limits import Admission, AdmittedStream, BodySizeLimit, RequestTimeout
from rstar.server.metrics import CONTENT_TYPE, RequestCounter, ServerMetrics
from rstar.server.model_store import default_tool_protocol
from rstar.server.replicas import ReplicatedEngine
from rstar.server.routes_evals import evals_router
from rstar.server.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, ModelCard, ModelList, TokenizeRequest
from rstar.server.schemas_responses import ResponsesRequest
from rstar.server.serving_base import Serving, sse
from rstar.server.serving_chat import ChatService
from rstar.server.serving_completions import CompletionService, detokenize
from rstar.server.serving_responses import ResponsesService

log = logging.getLogger("rstar.server")

EngineFactory = Callable[[], Awaitable[TokenEngine]]
SandboxFactory = Callable[[], SandboxClient]


def create_app(settings: Settings, engine_factory: EngineFactory, model_name: str, sandbox_factory: SandboxFactory | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # The process's one engine for its database: conversations, eval reads and RL runs all go through it.
        app.state.database = open_database(settings.resolved_database_url)
        engine = await engine_factory()
        sandbox = sandbox_factory() if sandbox_factory else connect(settings.sandbox, url=settings.api.sandbox_url)
        try:
            await sandbox.start()
        except Exception:  # the API still serves chat; tool calls answer internal_error and /health says why
            log.exception("the sandbox did not start; built-in tool calls will fail until it does")
        metrics = ServerMetrics(engine)
        api = settings.api
        serving = Serving(
            engine=engine,
            template=choose_template(engine.tokenizer, model_name, api.chat_template),
            sandbox=sandbox,
            model_names={model_name, settings.served_model_name or model_name, "default"},
            store=ConversationStore(app.state.database),
            settings=settings,
            metrics=metrics,
            admission=Admission(api.max_running_requests, api.max_waiting_requests, api.queue_timeout_s, api.retry_after_s),
            tool_protocol=api.tool_protocol or default_tool_protocol(model_name),
        )
        app.state.serving = serving
        app.state.model_name = model_name
        app.state.chat = ChatService(serving)
        app.state.completions = CompletionService(serving)
        app.state.responses = ResponsesService(serving)
        log.info("serving %s on http://%s:%d", model_name, settings.host, settings.port)
        try:
            yield
        finally:
            serving.renderer.shutdown(wait=False, cancel_futures=True)
            await sandbox.close()
            await engine.shutdown()
            close_database(app.state.database)

    app = FastAPI(title="rstar", version=rstar.__version__, lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.api.max_body_bytes)
    app.add_middleware(RequestCounter, metrics=lambda: getattr(app.state, "serving", None) and app.state.serving.metrics)
    if settings.api_key is None and not settings.insecure_no_auth:
        app.add_middleware(LoopbackHostOnly)

    authorized = api_key_guard(settings)
    admin = admin_key_guard(settings)

    @app.get("/health")
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

    @app.get("/version")
    async def version() -> dict:
        return {"version": rstar.__version__}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        serving = request.app.state.serving
        replicas = await serving.engine.replica_metrics() if isinstance(serving.engine, ReplicatedEngine) else b""
        return Response(serving.metrics.render(replicas), media_type=CONTENT_TYPE)

    @app.get("/v1/models", dependencies=authorized)
    async def list_models(request: Request) -> ModelList:
        engine = request.app.state.serving.engine
        return ModelList(data=[ModelCard(id=request.app.state.model_name, max_model_len=engine.max_model_len)])

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        chat: ChatService = request.app.state.chat
        if body.stream:
            return _event_stream(request, await chat.stream(body, time.monotonic()))
        return await _unless_disconnected(request, chat.complete(body, time.monotonic()))

    @app.post("/v1/completions", dependencies=authorized)
    async def completions(body: CompletionRequest, request: Request):
        service: CompletionService = request.app.state.completions
        if body.stream:
            return _event_stream(request, await service.stream(body, time.monotonic()))
        return await _unless_disconnected(request, service.complete(body, time.monotonic()))

    @app.post("/v1/responses", dependencies=authorized)
    async def responses(body: ResponsesRequest, request: Request):
        service: ResponsesService = request.app.state.responses
        if body.stream:
            return _event_stream(request, await service.stream(body, time.monotonic()))
        return await _unless_disconnected(request, service.create(body, time.monotonic()))

    @app.post("/tokenize", dependencies=authorized)
    async def tokenize_route(body: TokenizeRequest, request: Request) -> dict:
        return await request.app.state.chat.tokenize(body)

    @app.post("/detokenize", dependencies=authorized)
    async def detokenize_route(body: DetokenizeRequest, request: Request) -> dict:
        return detokenize(request.app.state.serving, body)

    # Conversation routes are plain functions: FastAPI runs them in its thread pool, so database I/O
    # stays off the event loop that streams tokens.
    @app.get("/v1/conversations", dependencies=admin)
    def list_conversations(request: Request, limit: int = Query(20, ge=1, le=200), offset: int = Query(0, ge=0)) -> dict:
        return {"object": "list", "data": _store(request).list(limit, offset)}

    @app.get("/v1/conversations/export.jsonl", dependencies=admin)
    def export_conversations(request: Request) -> StreamingResponse:
        # A sync iterator: Starlette runs it in a thread pool, off the event loop.
        return StreamingResponse(_store(request).export_jsonl(), media_type="application/x-ndjson")

    @app.get("/v1/conversations/{conversation_id}", dependencies=authorized)
    def get_conversation(conversation_id: str, request: Request) -> dict:
        found = _store(request).get(conversation_id)
        if found is None:
            raise _no_conversation(conversation_id)
        return found

    @app.delete("/v1/conversations/{conversation_id}", dependencies=authorized)
    def delete_conversation(conversation_id: str, request: Request) -> dict:
        if not _store(request).delete(conversation_id):
            raise _no_conversation(conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    app.include_router(evals_router(), dependencies=authorized)
    return app


def serve_refusal(settings: Settings) -> str | None:
    """Why `rstar serve` must not start with these settings, or None."""
    if settings.api_key is None and not is_loopback(settings.host) and not settings.insecure_no_auth:
        return (
            f"refusing to serve on {settings.host} without an API key: anyone who reaches it could chat, read the stored conversations "
            "and run code. Set RSTAR_API_KEY (or --api-key), listen on 127.0.0.1, or pass --insecure-no-auth to mean it."
        )
    if settings.enable_rl and settings.api_key is not None and settings.admin_key is None:
        return "--enable-rl on a server with an API key needs an admin key (RSTAR_ADMIN_KEY or --admin-key): RL retrains the model every client is served."
    return None


def _bearer_guard(key: str | None, which: str) -> list:
    async def require_key(request: Request) -> None:
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # Constant-time comparison: the server may face the internet.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
            raise APIError(401, f"Incorrect or missing {which}: send `Authorization: Bearer <key>`.", code=f"invalid_{which.replace(' ', '_')}")

    return [Depends(require_key)]


def api_key_guard(settings: Settings) -> list:
    """Route dependencies that require `Authorization: Bearer <key>` when the server has an API key."""
    return _bearer_guard(settings.api_key, "API key")


def admin_key_guard(settings: Settings) -> list:
    """Route dependencies for what changes the server or reads every client's data (RL runs, the conversation
    list and export): the admin key where there is one, else the API key."""
    if settings.admin_key is not None:
        return _bearer_guard(settings.admin_key, "admin key")
    return api_key_guard(settings)


class LoopbackHostOnly:
    """ASGI middleware for a server without a key: a request whose Host header is not a loopback name gets a
    421. A web page the operator opens cannot reach 127.0.0.1 by DNS rebinding then, since its requests carry
    the page's own host name."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not is_loopback(host_name(host)):
                message = f"Host {host!r} is not a loopback name: a server without an API key answers only requests addressed to localhost"
                return await JSONResponse(error_body(421, message, "host", "misdirected_request"), status_code=421)(scope, receive, send)
        await self.app(scope, receive, send)


def _store(request: Request) -> ConversationStore:
    return request.app.state.serving.store


def _no_conversation(conversation_id: str) -> APIError:
    return APIError(404, f"No conversation with id {conversation_id!r}.", "conversation_id", "conversation_not_found")


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
