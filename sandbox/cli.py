"""`rstar sandbox ...` commands; the root CLI mounts `app` with add_typer(app, name="sandbox")."""

from __future__ import annotations

import logging

import typer

app = typer.Typer(no_args_is_help=True)


@app.callback()
def sandbox() -> None:
    """The isolated Python executor the model's tool calls run in."""


@app.command()
def serve(
    host: str = typer.Option(None, help="Address to listen on (default from settings: 127.0.0.1)."),
    port: int = typer.Option(None, help="Port (default from settings: 8088, code-judge's)."),
    workers: int = typer.Option(None, help="Cells that may run at once."),
    timeout: float = typer.Option(None, help="Default wall-clock limit per call, seconds."),
    unsafe_no_isolation: bool = typer.Option(False, "--unsafe-no-isolation",
                                             help="Run model code without namespaces/seccomp/Landlock. Never on a shared machine."),
) -> None:
    """Serve POST /run, /run/batch, /run/long-batch, /verify and GET /health, /metrics."""
    import uvicorn

    from rstar.config import load_settings
    from rstar.network import is_loopback

    from .launch import IsolationError, detect_host, plan
    from .service import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings()
    overrides = {"host": host, "port": port, "workers": workers, "timeout_s": timeout}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if unsafe_no_isolation:
        overrides["unsafe_no_isolation"] = True
    sandbox = settings.sandbox.model_copy(update=overrides)
    if sandbox.token is None and not is_loopback(sandbox.host):
        typer.echo(f"rstar sandbox: refusing to serve on {sandbox.host} without a token: anyone who reaches it could run code. "
                   "Set RSTAR_SANDBOX__TOKEN (the API server sends the same), or listen on 127.0.0.1.", err=True)
        raise typer.Exit(2)
    try:
        plan(sandbox, detect_host(sandbox))  # refuse before binding the port; the pool re-checks inside a cell
    except IsolationError as exc:
        typer.echo(f"rstar sandbox: {exc}", err=True)
        raise typer.Exit(2) from exc
    uvicorn.run(create_app(sandbox), host=sandbox.host, port=sandbox.port, log_level="info")


if __name__ == "__main__":
    app()
