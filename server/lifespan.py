"""What the API holds while it runs: opened when the app starts, closed when it stops.

`serving_lifespan` opens the database, starts the engine (through the factory the app was built with: vLLM
for `rstar serve`, a scripted engine in tests) and the sandbox, and puts the long-lived `Serving` and the
endpoint services on `app.state`, where the routes find them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI

from rstar.config import Settings
from rstar.sandbox.clients import SandboxClient, connect
from rstar.server.chat_template import choose_template
from rstar.server.conversations import ConversationStore, purge_periodically
from rstar.server.db import close_database, open_database
from rstar.server.engine import TokenEngine
from rstar.server.limits import Admission
from rstar.server.metrics import ServerMetrics
from rstar.server.model_store import default_tool_protocol, model_sampling_defaults
from rstar.server.serving_base import Serving
from rstar.server.serving_chat import ChatService
from rstar.server.serving_completions import CompletionService
from rstar.server.serving_responses import ResponsesService

log = logging.getLogger("rstar.server")

EngineFactory = Callable[[], Awaitable[TokenEngine]]
SandboxFactory = Callable[[], SandboxClient]


@contextlib.asynccontextmanager
async def serving_lifespan(
    app: FastAPI, settings: Settings, engine_factory: EngineFactory, model_name: str, sandbox_factory: SandboxFactory | None = None
) -> AsyncIterator[Serving]:
    # The process's one engine for its database: conversations, eval reads and RL runs all go through it.
    app.state.database = open_database(settings.resolved_database_url)
    engine = await engine_factory()
    sandbox = sandbox_factory() if sandbox_factory else connect(settings.sandbox, url=settings.api.sandbox_url)
    try:
        await sandbox.start()
    except Exception:  # the API still serves chat; tool calls answer internal_error and /health says why
        log.exception("the sandbox did not start; built-in tool calls will fail until it does")
    api = settings.api
    serving = Serving(
        engine=engine,
        template=choose_template(engine.tokenizer, model_name, api.chat_template),
        sandbox=sandbox,
        model_names={model_name, settings.served_model_name or model_name, "default"},
        store=ConversationStore(app.state.database),
        settings=settings,
        metrics=ServerMetrics(engine),
        admission=Admission(api.max_running_requests, api.max_waiting_requests, api.queue_timeout_s, api.retry_after_s),
        tool_protocol=api.tool_protocol or default_tool_protocol(model_name),
        sampling_defaults=model_sampling_defaults(model_name) if api.sampling_defaults is None else api.sampling_defaults,
    )
    app.state.serving = serving
    app.state.model_name = model_name
    app.state.chat = ChatService(serving)
    app.state.completions = CompletionService(serving)
    app.state.responses = ResponsesService(serving)
    log.info("serving %s on http://%s:%d", model_name, settings.host, settings.port)
    if serving.sampling_defaults:
        log.info("requests that leave them out sample with %s (the model's recommended decoding; api.sampling_defaults={} turns it off)",
                 ", ".join(f"{name}={value:g}" for name, value in serving.sampling_defaults.items()))
    retention = settings.conversation_retention_days
    purging = asyncio.create_task(purge_periodically(serving.store, retention)) if retention else None
    if not retention and settings.store_conversations:
        log.info("stored conversations are kept forever; set conversation_retention_days to delete old ones")
    try:
        yield serving
    finally:
        if purging is not None:
            purging.cancel()
            await asyncio.gather(purging, return_exceptions=True)
        serving.renderer.shutdown(wait=False, cancel_futures=True)
        await sandbox.close()
        await engine.shutdown()
        close_database(app.state.database)
