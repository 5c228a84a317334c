"""What a caller of `rstar sandbox serve` cannot do: send a body past the cap, a batch past max_batch, a
cross-site form, skip the token, or reach another client's session. On a recording pool (no cells run;
tests/unit/test_sandbox_service.py drives the real service)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest
from fastapi.testclient import TestClient

from rstar.sandbox import service
from rstar.sandbox.clients import HttpClient
from rstar.sandbox.schemas import RunResult
from rstar.sandbox.settings import SandboxSettings

CONTAINER = "cntr_" + "a" * 32


class RecordingPool:
    def __init__(self, settings: SandboxSettings):
        self.settings = settings
        self.runs: list = []
        self.closed: list[str] = []

    async def start(self):
        return self

    async def close(self):
        pass

    async def run(self, request, queue_timeout_s=None):
        self.runs.append(request)
        return RunResult(status="ok", exit_code=0, stdout="", stderr="", duration_s=0.0)

    async def run_batch(self, requests, queue_timeout_s=None):
        return [await self.run(request) for request in requests]

    async def close_session(self, session_id):
        self.closed.append(session_id)

    def health(self):
        return {"status": "ok"}


@pytest.fixture
def sandbox_app():
    opened = []

    def start(**settings):
        pool = RecordingPool(SandboxSettings(**settings))
        client = TestClient(service.create_app(pool=pool))
        client.__enter__()
        opened.append(client)
        return client, pool

    yield start
    for client in opened:
        client.__exit__(None, None, None)


def test_only_json_bodies_run(sandbox_app):
    client, pool = sandbox_app()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"content-type": content_type} if content_type else {}
        refused = client.post("/run", content=b'{"code": "print(1)"}', headers=headers)
        assert refused.status_code == 415, content_type
        assert refused.json()["status"] == "invalid_input"
    assert pool.runs == []
    assert client.post("/run", json={"code": "print(1)"}).status_code == 200


def test_a_body_over_the_cap_is_refused_while_it_is_read(sandbox_app, monkeypatch):
    monkeypatch.setattr(service, "MAX_BODY_BYTES", 1000)
    client, pool = sandbox_app()
    code = "x" * 2000

    def chunked():  # no Content-Length: only counting while reading can stop it
        yield b'{"code": "'
        for _ in range(4):
            yield code[:500].encode()
        yield b'"}'

    refused = client.post("/run", content=chunked(), headers={"content-type": "application/json"})
    assert refused.status_code == 413 and "exceeds 1000 bytes" in refused.json()["stderr"]
    assert client.post("/run", json={"code": code}).status_code == 413  # declared too long
    assert pool.runs == []


def test_batches_are_bounded(sandbox_app):
    client, pool = sandbox_app(max_batch=3)
    assert client.post("/run/batch", json=[{"code": "1"}] * 4).status_code == 413
    assert client.post("/run/batch", json={"requests": [{"code": "1"}] * 4}).status_code == 413
    judge = {"type": "batch", "submissions": [{"type": "python", "solution": "print(1)"}] * 4}
    assert client.post("/run/long-batch", json=judge).status_code == 413
    assert pool.runs == []
    assert client.post("/run/batch", json=[{"code": "1"}] * 3).status_code == 200
    assert len(pool.runs) == 3


def test_a_token_guards_every_route_but_health(sandbox_app):
    client, pool = sandbox_app(token="t0ken")
    assert client.get("/health").status_code == 200
    routes = (("post", "/run"), ("post", "/run/batch"), ("post", "/verify"), ("delete", "/sessions/s"), ("delete", f"/containers/{CONTAINER}/session"), ("get", "/metrics"))
    for method, path in routes:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Bearer "}):
            kwargs = {"json": {"code": "1"}} if method == "post" else {}
            assert getattr(client, method)(path, headers=headers, **kwargs).status_code == 401, (path, headers)
    assert pool.runs == [] and pool.closed == []
    assert client.post("/run", json={"code": "1"}, headers={"authorization": "Bearer t0ken"}).status_code == 200


def test_sessions_are_scoped_to_their_creator(sandbox_app):
    client, pool = sandbox_app()
    mine, theirs = {"authorization": "Bearer a"}, {"authorization": "Bearer b"}
    client.post("/run", json={"code": "x = 1", "session_id": "s"}, headers=mine)
    client.post("/run", json={"code": "x", "session_id": "s"}, headers=theirs)
    client.post("/run/batch", json=[{"code": "x", "session_id": "s"}], headers=mine)
    first, second, batched = (request["session_id"] for request in pool.runs)
    assert first != second and first == batched and first.endswith("/s")
    client.delete("/sessions/s", headers=theirs)
    assert pool.closed == [second]  # theirs, not mine


def test_a_container_s_interpreter_is_closed_by_the_container_s_id_alone(sandbox_app):
    client, pool = sandbox_app()
    http = HttpClient("http://sandbox")
    http._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), base_url="http://sandbox")
    asyncio.run(http.close_container(CONTAINER))
    assert pool.closed == [CONTAINER]  # unscoped: the id the API runs its cells under
    refused = client.delete("/containers/cntr_not-an-id/session")
    assert refused.status_code == 400 and refused.json()["status"] == "invalid_input" and pool.closed == [CONTAINER]


def test_the_service_refuses_a_non_loopback_bind_without_a_token():
    env = {**os.environ, "RSTAR_SANDBOX__BWRAP_PATH": "/nonexistent/bwrap"}
    env.pop("RSTAR_SANDBOX__TOKEN", None)
    done = subprocess.run([sys.executable, "-m", "rstar.sandbox.cli", "serve", "--host", "0.0.0.0"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "without a token" in done.stderr, done.stderr


def test_the_http_client_sends_the_token():
    from rstar.sandbox.clients import connect

    client = connect(SandboxSettings(token="t0ken"), url="http://sandbox:8088")
    assert client._http.headers["authorization"] == "Bearer t0ken"
