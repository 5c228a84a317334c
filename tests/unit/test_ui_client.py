"""The UI's HTTP client: stream chunks -> events, server errors -> one readable line, no server -> a hint."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from rstar.ui.client import ApiClient, ApiError, StreamEvent, chunk_events


def test_chunk_events_reads_reasoning_cells_content_and_the_conversation_id():
    cell = {"index": 0, "status": "running", "code": "print(1)"}
    chunk = {"conversation_id": "c1", "choices": [{"index": 0, "delta": {"reasoning_content": "hm", "code_cell": cell, "content": "A"}, "finish_reason": "stop"}]}
    assert chunk_events(chunk) == [
        StreamEvent("started", "c1"),
        StreamEvent("reasoning", "hm"),
        StreamEvent("cell", cell),
        StreamEvent("content", "A"),
        StreamEvent("finished", "stop"),
    ]
    assert chunk_events({"choices": [], "usage": {"completion_tokens": 3}}) == []


def test_an_error_event_in_the_stream_raises_a_readable_error():
    with pytest.raises(ApiError, match="generation failed on the server: engine died"):
        chunk_events({"error": {"message": "engine died", "type": "server_error"}})


def run_against(app: FastAPI, scenario, timeout: float = 10.0):
    """Serve `app` with uvicorn on a loopback port and run `scenario(client)` against it."""
    import uvicorn

    async def main():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            return await scenario(ApiClient(f"http://127.0.0.1:{sock.getsockname()[1]}", api_key="k", timeout=timeout))
        finally:
            server.should_exit = True
            await task

    return asyncio.run(main())


def test_stream_chat_yields_events_and_sends_the_key():
    app = FastAPI()
    seen = {}

    @app.post("/v1/chat/completions")
    async def chat(body: dict, request: Request):
        seen["auth"], seen["stream"] = request.headers.get("authorization"), body["stream"]

        async def events():
            yield "data: " + json.dumps({"conversation_id": "c9", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}) + "\n\n"
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "42"}, "finish_reason": "stop"}]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def scenario(client):
        return [event async for event in client.stream_chat({"model": "m", "messages": []})]

    events = run_against(app, scenario)
    assert events == [StreamEvent("started", "c9"), StreamEvent("content", "42"), StreamEvent("finished", "stop")]
    assert seen == {"auth": "Bearer k", "stream": True}


def test_a_stream_quiet_for_longer_than_the_timeout_goes_on():
    """A long tool call leaves the stream quiet; the client's timeout is for answering, not for the stream's pauses."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        async def events():
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"reasoning_content": "Running it."}}]}) + "\n\n"
            await asyncio.sleep(1.0)
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "42"}, "finish_reason": "stop"}]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def scenario(client):
        return [event async for event in client.stream_chat({"model": "m", "messages": []})]

    assert run_against(app, scenario, timeout=0.3)[-1] == StreamEvent("finished", "stop")


def test_http_errors_become_the_servers_message():
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat():
        return JSONResponse({"error": {"message": "The model `x` does not exist.", "type": "not_found_error"}}, status_code=404)

    @app.get("/v1/evals/runs/{run_id}")
    async def loading(run_id: str):
        return JSONResponse({"error": {"message": "engine starting"}}, status_code=503)

    async def scenario(client):
        errors = []
        for attempt in (lambda: client.stream_chat({"model": "x"}).__anext__(), lambda: client.eval_run("r")):
            with pytest.raises(ApiError) as caught:
                await attempt()
            errors.append(str(caught.value))
        return errors

    errors = run_against(app, scenario)
    assert errors == ["The server answered 404: The model `x` does not exist.", "The server is not ready (model loading?): engine starting"]


def test_no_server_is_a_hint_not_a_traceback():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = ApiClient(f"http://127.0.0.1:{port}")
    with pytest.raises(ApiError, match=f"Cannot reach the server at http://127.0.0.1:{port}: is `rstar serve` running"):
        asyncio.run(client.models())
    with pytest.raises(ApiError, match="Cannot reach the server"):
        asyncio.run(anext(client.stream_chat({})))


def test_a_server_that_accepts_but_does_not_answer_reads_as_still_loading():
    # `rstar serve` holds its port from the start, while the engine loads: connections wait, unanswered.
    with socket.socket() as loading:
        loading.bind(("127.0.0.1", 0))
        loading.listen(8)
        client = ApiClient(f"http://127.0.0.1:{loading.getsockname()[1]}", timeout=0.5)
        with pytest.raises(ApiError, match=r"did not answer in time \(still loading the model\?\)"):
            asyncio.run(client.health())


def test_the_status_line_names_a_degraded_sandbox():
    from rstar.ui.app import server_status

    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "degraded", "model": "m", "sandbox": {"status": "unreachable", "detail": "connection refused"}}

    line = run_against(app, server_status)
    assert line.startswith("Connected to `http://127.0.0.1:") and "model `m`" in line and line.endswith("⚠ sandbox: unreachable")
