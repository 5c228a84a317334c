"""`rstar`: the command line. Each command builds Settings (defaults < env < flags) and calls one module."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import socket
from collections.abc import Iterator
from typing import Annotated, Optional

import typer
from rich.console import Console

from rstar.config import load_settings, mask_url, masked
from rstar.evals.cli import app as eval_app
from rstar.rl.cli import app as rl_app
from rstar.sandbox.cli import app as sandbox_app
from rstar.ui.cli import app as ui_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Serve, evaluate and train tool-using reasoning models (rStar2-Agent).")
model_app = typer.Typer(no_args_is_help=True, help="Model weights: pull the embedded default, check a model id.")
config_app = typer.Typer(no_args_is_help=True, help="Configuration.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(model_app, name="model")
app.add_typer(config_app, name="config")
app.add_typer(db_app, name="db")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(eval_app, name="eval")
app.add_typer(ui_app, name="ui")
app.add_typer(rl_app, name="rl")

console = Console(stderr=True)

ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="'default' (embedded SmolLM2-135M-Instruct), a local directory or a Hugging Face id. [env: RSTAR_MODEL]")]


class PortInUse(OSError):
    pass


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    """Errors a user can fix print as one line naming what to do, not as a traceback."""
    from rstar.server.engine import EngineNotInstalled
    from rstar.server.model_store import ModelNotFound, ModelPullFailed

    try:
        yield
    except (ModelNotFound, ModelPullFailed, EngineNotInstalled, PortInUse) as exc:
        console.print(f"[red]rstar:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _progress_printer():
    return lambda message: console.print(f"  {message}", highlight=False)


@model_app.command("pull")
def model_pull(model: ModelOpt = None) -> None:
    """Fetch the model into the cache (the embedded default: download, verify, dequantize). Idempotent."""
    from rstar.server.model_store import resolve_model

    settings = load_settings(model=model)
    with _one_line_errors(), console.status(f"pulling {settings.model}"):
        resolved = resolve_model(settings.model, settings.models_dir, progress=_progress_printer())
    typer.echo(resolved.path)


def _bind(host: str, port: int) -> socket.socket:
    """Hold the port from the start, so a clash fails in a second rather than after a 40 s engine start
    (uvicorn binds only after the app's start-up, which is where the engine loads)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"port {port} on {host} is already in use: stop the other server or choose another with --port (env RSTAR_PORT)") from None
        raise
    sock.listen(2048)
    return sock


@app.command()
def serve(
    model: ModelOpt = None,
    host: Annotated[Optional[str], typer.Option(help="Interface to listen on. [env: RSTAR_HOST]")] = None,
    port: Annotated[Optional[int], typer.Option(help="[env: RSTAR_PORT]")] = None,
    api_key: Annotated[Optional[str], typer.Option(help="Require this bearer token on /v1. [env: RSTAR_API_KEY]")] = None,
    admin_key: Annotated[
        Optional[str], typer.Option(help="A second bearer token for RL runs and the conversation list/export. [env: RSTAR_ADMIN_KEY]")
    ] = None,
    enable_rl: Annotated[
        Optional[bool], typer.Option("--enable-rl", help="Let the API start RL runs that retrain the served model (admin key). [env: RSTAR_ENABLE_RL]")
    ] = None,
    insecure_no_auth: Annotated[
        Optional[bool],
        typer.Option("--insecure-no-auth", help="Serve on a non-loopback --host without an API key: anyone who reaches it may chat and run code. [env: RSTAR_INSECURE_NO_AUTH]"),
    ] = None,
    served_model_name: Annotated[Optional[str], typer.Option(help="Model name clients send. [env: RSTAR_SERVED_MODEL_NAME]")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(help="Context window. [env: RSTAR_ENGINE__MAX_MODEL_LEN]")] = None,
    sandbox_url: Annotated[
        Optional[str], typer.Option(help="Run model code in this `rstar sandbox serve` instead of an in-process sandbox pool. [env: RSTAR_API__SANDBOX_URL]")
    ] = None,
    replicas: Annotated[
        Optional[int], typer.Option(help="Engines behind one router, as Ray actors: one per GPU, or a share of the CPU cores each. [env: RSTAR_ENGINE__REPLICAS]")
    ] = None,
    ray_address: Annotated[
        Optional[str], typer.Option(help="Ray cluster for the replicas ('auto', 'ray://host:10001'); default a local Ray. [env: RSTAR_ENGINE__RAY_ADDRESS]")
    ] = None,
    routing: Annotated[
        Optional[str], typer.Option(help="Replica choice: least_requests (default), kv_aware or round_robin. [env: RSTAR_ENGINE__ROUTING]")
    ] = None,
) -> None:
    """Start the OpenAI-compatible API on one engine (or --replicas N behind a router), with the web UI at /ui (pulls the embedded default model if needed)."""
    from rstar.server.auth import serve_refusal
    from rstar.server.engine import check_vllm_installed
    from rstar.server.model_store import resolve_model
    from rstar.server.ray_replicas import require_ray, wants_replicas

    given = {"max_model_len": max_model_len, "replicas": replicas, "ray_address": ray_address, "routing": routing}
    engine_overrides = {key: value for key, value in given.items() if value is not None} or None
    api_overrides = {"sandbox_url": sandbox_url} if sandbox_url else None
    settings = load_settings(
        model=model,
        host=host,
        port=port,
        api_key=api_key,
        admin_key=admin_key,
        enable_rl=enable_rl,
        insecure_no_auth=insecure_no_auth,
        served_model_name=served_model_name,
        engine=engine_overrides,
        api=api_overrides,
    )
    if refusal := serve_refusal(settings):
        console.print(f"[red]rstar:[/red] {refusal}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    replicated = wants_replicas(settings.engine)
    # What a user can get wrong is checked before the API, the UI and the engine are imported (half a minute
    # on a small CPU), so a busy port or an unknown model is said at once.
    with _one_line_errors():
        check_vllm_installed()
        if replicated:
            require_ray()
        sock = _bind(settings.host, settings.port)
        with console.status(f"resolving model {settings.model}"):
            resolved = resolve_model(settings.model, settings.models_dir, progress=_progress_printer())
    name = settings.served_model_name or resolved.name

    import uvicorn

    from rstar.app import build_app
    from rstar.server.ray_replicas import start_engine
    from rstar.ui.app import UI_PATH

    async def start_engines():
        return await start_engine(resolved.path, settings.engine, served_model_name=name, cache_dir=settings.cache_dir)

    api = build_app(settings, start_engines, name, ui=True)
    engines = f"{settings.engine.replicas} engine replicas (routing {settings.engine.routing})" if replicated else "the engine"
    console.print(f"starting {engines} on {resolved.path} (on CPU about a minute, a first compiled start several; the 'engine defaults' line says which); API at http://{settings.host}:{settings.port}/v1", highlight=False)
    console.print(f"UI at http://{settings.host}:{settings.port}{UI_PATH} once the engine is up", highlight=False, soft_wrap=True)
    server = uvicorn.Server(uvicorn.Config(api, log_level="info"))
    server.run(sockets=[sock])


@config_app.command("show")
def config_show() -> None:
    """Print the effective settings (defaults < RSTAR_* environment) as JSON; secrets masked."""
    typer.echo(json.dumps(masked(load_settings()), indent=2))


@db_app.command("upgrade")
def db_upgrade(database_url: Annotated[Optional[str], typer.Option(help="[env: RSTAR_DATABASE_URL]")] = None) -> None:
    """Apply schema migrations (the server also does this on start)."""
    from rstar.server.db import current_revision, make_engine, upgrade

    settings = load_settings(database_url=database_url)
    engine = make_engine(settings.resolved_database_url)
    upgrade(engine)
    typer.echo(f"{mask_url(settings.resolved_database_url)}: schema at revision {current_revision(engine)}")


def main() -> None:
    from rstar.config import SettingsInvalid

    try:
        app()
    except SettingsInvalid as exc:  # any command: a bad RSTAR_* value is one line, not a traceback
        console.print(f"[red]rstar:[/red] {exc}", highlight=False, soft_wrap=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
