"""The Gradio app: Chat, Evaluations and Training tabs over one API endpoint, served alone or mounted on the API."""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager

import gradio as gr
from fastapi import FastAPI

from rstar.ui.chat import CHAT_CLASS, RENDER_INTERVAL_S, build_chat_tab
from rstar.ui.client import ApiClient, ApiError
from rstar.ui.evals import build_evals_tab
from rstar.ui.render import CELL_CLASS, NOTE_CLASS
from rstar.ui.scratch import DOWNLOAD_MAX_AGE_S, Scratch
from rstar.ui.training import build_training_tab

UI_PATH = "/ui"

# System fonts only: Gradio's default theme fetches Google Fonts, which offline deployments cannot reach
# (the page would wait on them).
THEME = gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])

# Gradio gives every chat message a copy button and every code block another (six for one answer with a cell).
# A chat of answers keeps one per cell, its code's, and one per answer, the answer message's own: the reasoning,
# the raw answer, a cell's message and outputs, and the notes (stopped, cut off) keep none. The conversation list
# shows one conversation a line and scrolls past a screenful.
CSS = f"""
#chat-notice p, #evals-notice p, #training-notice p {{ color: #b45309; font-weight: 600; }}
.{CHAT_CLASS} .message:has(.thought-group, .{CELL_CLASS}, .{NOTE_CLASS}) + .message-buttons,
.{CHAT_CLASS} .message:not(:has(.{CELL_CLASS})) .copy_code_button,
.{CHAT_CLASS} .code_wrap:not(:has(code.language-python)) .copy_code_button {{ display: none; }}
#conversations .wrap {{ flex-direction: column; flex-wrap: nowrap; max-height: 560px; overflow-y: auto; }}
"""


async def server_status(client: ApiClient) -> str:
    """One line about the server the page talks to, or what is wrong with it."""
    try:
        health = await client.health()
    except ApiError as exc:
        return f"⚠ {exc}"
    parts = [f"Connected to `{client.base_url}`", f"model `{health.get('model', '?')}`"]
    sandbox = health.get("sandbox")
    if isinstance(sandbox, dict) and sandbox.get("status") not in (None, "ok"):
        parts.append(f"⚠ sandbox: {sandbox.get('status')}")
    return " · ".join(parts)


IDLE_QUEUE_POLL_S = 0.05


def build_ui(endpoint: str, scratch: Scratch, api_key: str | None = None, render_floor_s: float = RENDER_INTERVAL_S) -> gr.Blocks:
    client = ApiClient(endpoint, api_key)
    # Gradio copies every file it serves into its cache and keeps them until the process ends unless told:
    # each hour it drops those older than the downloads' own limit.
    cache_age = int(DOWNLOAD_MAX_AGE_S)
    with gr.Blocks(title="rStar2-Agent", analytics_enabled=False, delete_cache=(cache_age, cache_age)) as demo:
        gr.Markdown("## rStar2-Agent: a reasoning model that writes and runs Python")
        status = gr.Markdown(elem_id="server-status")
        with gr.Tab("Chat", elem_id="tab-chat"):
            build_chat_tab(client, demo, scratch, render_floor_s)
        with gr.Tab("Evaluations", elem_id="tab-evals"):
            build_evals_tab(client, demo)
        with gr.Tab("Training", elem_id="tab-training"):
            build_training_tab(client, demo)

        async def load_status():
            return await server_status(client)

        demo.load(load_status, None, status)
    # Gradio's queue polls every 1 ms while idle. Mounted in the API's own event loop that costs about 5% of a
    # core with nobody on the page (measured: 0.48 s CPU per 10 s idle vs vLLM's 0.13 s) and interleaves
    # with token streaming; 50 ms, Gradio's own Windows default, is imperceptible to a person clicking.
    demo._queue.sleep_when_free = IDLE_QUEUE_POLL_S
    return demo


def mount_ui(app: FastAPI, endpoint: str, api_key: str | None = None, path: str = UI_PATH, render_floor_s: float = RENDER_INTERVAL_S) -> FastAPI:
    """Serve the UI at `path` on an existing FastAPI app (the API's own, for `rstar serve`).

    With an API key the UI asks for it as its password: the UI holds the key and calls the API with it, so
    an open UI would hand the protected API to anyone who can reach the page.
    """

    def key_matches(_user: str, password: str) -> bool:
        return hmac.compare_digest(password.encode(), api_key.encode())

    scratch = Scratch()
    serving = app.router.lifespan_context

    # The downloads go when the app stops, not at interpreter exit: uvicorn ends a SIGTERM'd server by raising
    # the signal again with its default action, which kills the process before atexit (and so
    # TemporaryDirectory's finalizer) runs; every stopped server left its directory in /tmp.
    @asynccontextmanager
    async def lifespan(application: FastAPI):
        try:
            async with serving(application) as state:
                yield state
        finally:
            scratch.close()

    app.router.lifespan_context = lifespan
    return gr.mount_gradio_app(
        app,
        build_ui(endpoint, scratch, api_key, render_floor_s),
        path=path,
        theme=THEME,
        css=CSS,
        auth=key_matches if api_key else None,
        auth_message="This server requires its API key: enter it as the password (any user name).",
    )
