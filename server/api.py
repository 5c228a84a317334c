"""The HTTP app: thin routes over the services, OpenAI-shaped errors, engine lifetime.

`create_app` takes an engine factory so tests can run the same app on a scripted engine; `rstar serve`
passes one that starts vLLM.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import StreamingResponse

import rstar
from rstar.config import Settings
from rstar.server.conversations import ConversationStore
from rstar.server.db import open_database
from rstar.server.engine import TokenEngine
from rstar.server.errors import APIError, install_error_handlers
from rstar.server.routes_evals import evals_router
from rstar.server.schemas import ChatCompletionRequest, ModelCard, ModelList
from rstar.server.serving_chat import ChatService, sse_error

log = logging.getLogger("rstar.server")

EngineFactory = Callable[[], Awaitable[TokenEngine]]


def create_app(settings: Settings, engine_factory: EngineFactory, model_name: str) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = await engine_factory()
        store = ConversationStore(open_database(settings.resolved_database_url))
        names = {model_name, settings.served_model_name or model_name, "default"}
        app.state.engine = engine
        app.state.model_name = model_name
        app.state.chat = ChatService(engine, names, store, settings.store_conversations)
        log.info("serving %s on http://%s:%d", model_name, settings.host, settings.port)
        try:
            yield
        finally:
            await engine.shutdown()

    app = FastAPI(title="rstar", version=rstar.__version__, lifespan=lifespan)
    install_error_handlers(app)

    async def require_api_key(request: Request) -> None:
        if settings.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # Constant-time comparison: the server may face the internet.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), settings.api_key.encode()):
            raise APIError(401, "Incorrect or missing API key: send `Authorization: Bearer <key>`.", code="invalid_api_key")

    @app.get("/health")
    async def health(request: Request) -> dict:
        stats = request.app.state.engine.stats()
        return {"status": "ok", "model": request.app.state.model_name, "engine": stats.__dict__}

    @app.get("/v1/models", dependencies=[Depends(require_api_key)])
    async def list_models(request: Request) -> ModelList:
        engine = request.app.state.engine
        return ModelList(data=[ModelCard(id=request.app.state.model_name, max_model_len=engine.max_model_len)])

    @app.post("/v1/chat/completions", dependencies=[Depends(require_api_key)])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        chat: ChatService = request.app.state.chat
        if not body.stream:
            return await chat.complete(body)
        return StreamingResponse(_guard_stream(await chat.stream(body)), media_type="text/event-stream")

    app.include_router(evals_router(settings.resolved_database_url), dependencies=[Depends(require_api_key)])
    return app


async def _guard_stream(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Once the 200 and the first bytes are out, an error can only travel as an SSE event."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        log.exception("stream failed")
        yield sse_error(f"{type(exc).__name__}: {exc}")
