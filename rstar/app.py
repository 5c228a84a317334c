"""The server `rstar serve` runs, put together in one place: every route it answers is mounted here.

    OpenAI API      server/api.py                   /health, /version, /metrics, /v1/models, /v1/chat/completions,
                                                    /v1/completions, /v1/responses, /tokenize, /detokenize
    conversations   server/routes_conversations.py  /v1/conversations, its export, one conversation (get, delete)
    containers      server/routes_containers.py     /v1/containers and their files (OpenAI's Containers API subset)
    files           server/routes_files.py          /v1/files (OpenAI's Files API subset: what file_ids name)
    evals           server/routes_evals.py          /v1/evals/runs and their samples and files (read-only)
    RL              rl/api.py                       /v1/rl/runs (only with settings.enable_rl, behind the admin key)
    UI              ui/app.py                       /ui (Gradio; it calls the API over HTTP like any client)

`server/auth.py` says who may call what (the API key, the admin key, loopback Host names without a key) and
`server/limits.py` bounds what a call may take (the body size, admission, the request's deadline). The
server package never imports `rl/` or `ui/`; this module joins them.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI

import rstar
from rstar.config import Settings
from rstar.rl import api as rl_api
from rstar.server import api as openai_api
from rstar.server import routes_containers, routes_conversations, routes_evals, routes_files
from rstar.server.auth import ADMIN_KEY, API_KEY, LoopbackHostOnly
from rstar.server.containers import ContainerStore, purge_expired_periodically
from rstar.server.errors import install_error_handlers
from rstar.server.files import FileStore
from rstar.server.lifespan import EngineFactory, SandboxFactory, serving_lifespan
from rstar.server.limits import BodySizeLimit, UploadRoute
from rstar.server.metrics import RequestCounter


def build_app(
    settings: Settings, engine_factory: EngineFactory, model_name: str, sandbox_factory: SandboxFactory | None = None, ui: bool = False
) -> FastAPI:
    """The API for `model_name` on the engine `engine_factory` starts (and the sandbox `sandbox_factory`
    makes, else the one the settings name); with `ui`, the web UI at /ui, talking to this same server."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async with serving_lifespan(app, settings, engine_factory, model_name, sandbox_factory):
            purging = asyncio.create_task(purge_expired_periodically(app.state.containers, app.state.serving.sandbox))
            try:
                yield
            finally:
                purging.cancel()
                if settings.enable_rl:  # before the engine closes under the run
                    await app.state.rl_runs.stop()

    app = FastAPI(title="rstar", version=rstar.__version__, lifespan=lifespan)
    app.state.settings = settings
    install_error_handlers(app)
    app.state.containers = ContainerStore(settings.containers_dir, settings.containers)
    app.state.files = FileStore(settings.files_dir, settings.files)
    uploads = (UploadRoute(routes_containers.UPLOAD_PATH, settings.containers.max_file_bytes, "containers.max_file_bytes"),
               UploadRoute(routes_files.UPLOAD_PATH, settings.files.max_file_bytes, "files.max_file_bytes"))  # fmt: skip
    app.add_middleware(BodySizeLimit, max_bytes=settings.api.max_body_bytes, uploads=uploads)
    app.add_middleware(RequestCounter, metrics=lambda: getattr(app.state, "serving", None) and app.state.serving.metrics)
    if settings.api_key is None and not settings.insecure_no_auth:
        app.add_middleware(LoopbackHostOnly)

    app.include_router(openai_api.router)
    app.include_router(routes_conversations.router)
    app.include_router(routes_containers.router)
    app.include_router(routes_files.router)
    app.include_router(routes_evals.router, dependencies=API_KEY)
    if settings.enable_rl:
        app.state.rl_runs = rl_api.RlRuns(settings)
        app.include_router(rl_api.router, dependencies=ADMIN_KEY)
    if ui:
        from rstar.ui.app import mount_ui  # Gradio is a large import that API-only apps (tests, benchmarks) skip

        # The UI talks to this same server over HTTP, as it would to a remote one.
        mount_ui(app, loopback_url(settings), settings.api_key)
    return app


def loopback_url(settings: Settings) -> str:
    """Where this server is reached from its own process: a wildcard bind is reached on loopback."""
    host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(settings.host, f"[{settings.host}]" if ":" in settings.host else settings.host)
    return f"http://{host}:{settings.port}"
