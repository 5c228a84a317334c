"""`rstar ui --endpoint URL`: the UI alone, against any rstar server (local or remote)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

app = typer.Typer(add_completion=False, help="The web UI (chat + evaluations) against a running rstar server.")


@app.callback(invoke_without_command=True)
def ui(
    endpoint: Annotated[str, typer.Option(help="The rstar server's base URL (without /v1).")] = "http://127.0.0.1:8000",
    host: Annotated[str, typer.Option(help="Interface the UI listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port the UI listens on.")] = 7860,
    api_key: Annotated[Optional[str], typer.Option(help="Bearer token, if the server requires one. [env: RSTAR_API_KEY]", envvar="RSTAR_API_KEY")] = None,
    render_interval: Annotated[
        Optional[float], typer.Option(min=0, help="Least seconds between an answer's updates of the page, longer for a long answer (0: one per streamed event). [default: 1/15]")
    ] = None,
) -> None:
    """Serve the UI on its own port; every request goes to ENDPOINT over HTTP."""
    import uvicorn
    from fastapi import FastAPI

    from rstar.ui.app import UI_PATH, mount_ui

    pacing = {} if render_interval is None else {"render_floor_s": render_interval}
    app = mount_ui(FastAPI(), endpoint, api_key, path=UI_PATH, **pacing)
    typer.echo(f"UI at http://{host}:{port}{UI_PATH} (server: {endpoint})")
    uvicorn.run(app, host=host, port=port, log_level="warning")
