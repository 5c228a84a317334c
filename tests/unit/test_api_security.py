"""What a hostile client cannot do to the API: supply a template, hold the event loop with a render, get in
without the key. On a scripted engine and sandbox (the live-server check is tests/integration/test_api_live.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from rstar.app import build_app
from rstar.config import load_settings
from rstar.server.db import Conversation
from tests.processes import serve_in_thread
from tests.scripted_engine import ScriptedEngine
from tests.scripted_sandbox import ScriptedSandbox
from tests.unit.api_server import TOOL_TURNS, make_server, sandbox_of  # noqa: F401 (fixture)
from tests.waiting import wait_for

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
# About 5 s of rendering per pass on this machine: a render on the event loop would hold /health that long,
# well past what a busy machine's scheduling adds.
SLOW_TEMPLATE = "{% for i in range(20000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}"


def _health_latencies_while(http, pending) -> list[float]:
    latencies = []
    while not pending.done():
        started = time.monotonic()
        assert http.get("/health").status_code == 200
        latencies.append(time.monotonic() - started)
    return latencies


def test_a_request_cannot_supply_the_template_it_renders(make_server):
    _, http, engine, _ = make_server()
    for template in (None, "model", "rstar"):
        body = {"model": "scripted", "messages": QUESTION, "chat_template_kwargs": {"chat_template": SLOW_TEMPLATE}}
        if template:
            body["chat_template"] = template
        started = time.monotonic()
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "chat_template_kwargs"
        assert "chat_template" in response.json()["error"]["message"]
        assert time.monotonic() - started < 1.0
    assert engine.prompts == []


def test_a_slow_render_is_a_400_and_the_event_loop_keeps_serving(make_server, tmp_path):
    slow = tmp_path / "slow.jinja"
    slow.write_text(SLOW_TEMPLATE, encoding="utf-8")
    _, http, engine, _ = make_server(api={"chat_template": str(slow), "render_timeout_s": 1.0})
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(http.post, "/v1/chat/completions", json={"model": "scripted", "messages": QUESTION})
        time.sleep(0.1)
        latencies = _health_latencies_while(http, pending)
        response = pending.result()
    assert response.status_code == 400 and response.json()["error"]["code"] == "render_timeout", response.text
    assert response.json()["error"]["param"] == "messages"
    assert len(latencies) >= 3 and max(latencies) < 1.5, latencies
    assert engine.prompts == []


def test_an_empty_api_key_is_a_start_up_error_naming_the_variable(monkeypatch):
    from rstar.config import SettingsInvalid, load_settings

    monkeypatch.setenv("RSTAR_API_KEY", "")
    with pytest.raises(SettingsInvalid, match="RSTAR_API_KEY.*empty key"):
        load_settings()
    monkeypatch.setenv("RSTAR_API_KEY", "k1")
    with pytest.raises(SettingsInvalid, match="admin_key must differ") as refused:
        load_settings(admin_key="k1")
    assert "k1" not in str(refused.value)  # a refused secret is not printed


@pytest.mark.parametrize(
    ("settings", "refused"),
    [
        ({"host": "0.0.0.0"}, "without an API key"),
        ({"host": "192.168.1.5"}, "without an API key"),
        ({"host": "::"}, "without an API key"),
        ({"host": "0.0.0.0", "insecure_no_auth": True}, None),
        ({"host": "0.0.0.0", "api_key": "k"}, None),
        ({"host": "127.0.0.1"}, None),
        ({"host": "::1"}, None),
        ({"host": "localhost"}, None),
        ({"api_key": "k", "enable_rl": True}, "needs an admin key"),
        ({"api_key": "k", "admin_key": "a", "enable_rl": True}, None),
        ({"enable_rl": True}, None),  # loopback, no keys at all: the operator's own machine
    ],
)
def test_serve_refuses_an_open_bind_without_a_key_and_rl_without_an_admin_key(settings, refused):
    from rstar.config import load_settings
    from rstar.server.auth import serve_refusal

    refusal = serve_refusal(load_settings(**settings))
    assert (refusal is None) if refused is None else (refused in refusal), refusal


def test_rstar_serve_exits_before_anything_starts_on_an_open_bind_without_a_key(tmp_path):
    env = {"RSTAR_DATA_DIR": str(tmp_path), "RSTAR_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "rstar.cli", "serve", "--host", "0.0.0.0"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "--insecure-no-auth" in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())


def test_without_a_key_only_loopback_host_headers_are_answered(make_server):
    _, http, _, _ = make_server()
    assert http.get("/v1/models").status_code == 200  # Host: localhost
    for host in ("127.0.0.1:8000", "[::1]:8000", "localhost"):
        assert http.get("/v1/models", headers={"host": host}).status_code == 200, host
    for host in ("attacker.example:8000", "attacker.example", "10.0.0.2", ""):
        refused = http.get("/v1/conversations", headers={"host": host})
        assert refused.status_code == 421, host
        assert refused.json()["error"]["param"] == "host"


def test_with_a_key_any_host_is_answered_with_the_key(make_server):
    _, http, _, _ = make_server(api_key="sekrit")
    assert http.get("/v1/models", headers={"host": "api.example.com", "authorization": "Bearer sekrit"}).status_code == 200
    refused = http.get("/v1/models", headers={"host": "api.example.com", "authorization": "Bearer "})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"  # OpenAI's code


def test_the_conversation_list_and_export_need_the_admin_key_when_there_is_one(make_server):
    client, http, _, _ = make_server(api_key="chat", admin_key="admin")
    client.chat.completions.create(model="scripted", messages=QUESTION)
    chat, admin = {"authorization": "Bearer chat"}, {"authorization": "Bearer admin"}
    for path in ("/v1/conversations", "/v1/conversations/export.jsonl"):
        refused = http.get(path, headers=chat)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_admin_key", path
        assert http.get(path, headers=admin).status_code == 200, path
    listed = http.get("/v1/conversations", headers=admin).json()["data"]
    assert http.get(f"/v1/conversations/{listed[0]['id']}", headers=chat).status_code == 200  # its id is what the client was given


# -- streams whose client does not read ----------------------------------------------------------------
# Starlette's TestClient hands each body chunk over only when the client reads it: a client that reads
# nothing leaves the server waiting in `send`, as a socket whose buffers filled up does under uvicorn.


def _running(http) -> int:
    return http.get("/health").json()["admission"]["running"]


def _seconds_until_slots_return(http, limit_s: float) -> float:
    started = time.monotonic()
    while _running(http):
        assert time.monotonic() - started < limit_s, f"the stream still holds its slots after {limit_s:g} s"
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_stream_whose_client_never_reads_gives_its_slots_back_at_the_deadline(make_server):
    _, http, engine, _ = make_server(replies=("slow " * 500,), api={"request_timeout_s": 1.0, "write_timeout_s": 10.0})
    body = {"model": "scripted", "messages": QUESTION, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200 and _running(http) == 1
        assert _seconds_until_slots_return(http, 8.0) < 4.0  # the 1 s deadline, not the 10 s write timeout
        assert engine.stats().unfinished == 0
        # A client that reads again in time hears of the deadline as one that kept reading would.
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert "did not finish within 1 s" in json.loads(events[-1])["error"]["message"]
    assert "rstar_client_disconnects_total 0.0" in http.get("/metrics").text


def test_a_stream_whose_client_stops_reading_is_cut_after_the_write_timeout(make_server):
    _, http, engine, _ = make_server(replies=("slow " * 500,), api={"request_timeout_s": 600.0, "write_timeout_s": 0.5})
    engine.token_delay_s = 0.002
    body = {"model": "scripted", "prompt": "Count:", "max_tokens": 500, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        next(lines)  # it reads a little, then stops (the iterator kept: closing it would close the connection)
        assert _running(http) == 1
        assert _seconds_until_slots_return(http, 8.0) < 4.0  # the 0.5 s write timeout, not the 600 s deadline
        assert engine.stats().unfinished == 0 and len(engine.aborted) == 1
    assert "rstar_client_disconnects_total 0.0" in http.get("/metrics").text  # cut by the server: the client stayed


def test_under_uvicorn_a_stream_whose_socket_fills_up_gives_its_slots_back_at_the_deadline(tmp_path, default_tokenizer):
    """The same on a real socket: uvicorn's `send` waits once the socket's buffers are full."""
    settings = load_settings(data_dir=tmp_path, api={"request_timeout_s": 1.5})
    word = default_tokenizer.encode(" " + "x" * 60, add_special_tokens=False)
    engine = ScriptedEngine(default_tokenizer, [word * 400_000], max_model_len=10**8, tokens_per_delta=2000)  # far more than the buffers hold

    async def factory():
        return engine

    url, stop = serve_in_thread(build_app(settings, factory, "scripted", sandbox_factory=ScriptedSandbox))
    try:
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as silent:
            body = json.dumps({"model": "scripted", "prompt": [1, 2, 3], "max_tokens": 10**7, "stream": True}).encode()
            head = f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            silent.sendall(head.encode() + body)  # and never reads
            started = time.monotonic()
            wait_for(lambda: httpx.get(f"{url}/health").json()["admission"]["running"] == 0, 10, "the stream still holds its slot")
            assert time.monotonic() - started < 6 and len(engine.aborted) == 1
    finally:
        stop()


# -- a request's share of the sandbox -----------------------------------------------------------------


def test_a_tool_timeout_past_the_servers_ceiling_is_a_400_naming_it(make_server, monkeypatch):
    monkeypatch.setenv("RSTAR_SANDBOX__MAX_TIMEOUT_S", "20")  # below the API's own 30 s
    _, http, _, _ = make_server()
    for tool_timeout, ceiling in ((21, 20), (60, 20)):
        response = http.post("/v1/chat/completions", json={"model": "scripted", "messages": QUESTION, "tool_timeout": tool_timeout})
        assert response.status_code == 400 and response.json()["error"]["param"] == "tool_timeout", response.text
        assert f"at most {ceiling} s" in response.json()["error"]["message"]
    assert http.post("/v1/chat/completions", json={"model": "scripted", "messages": QUESTION, "tool_timeout": 20}).status_code == 200
    monkeypatch.delenv("RSTAR_SANDBOX__MAX_TIMEOUT_S")
    _, http, _, _ = make_server()  # the API's own ceiling, below the sandbox's 60 s
    response = http.post("/v1/responses", json={"model": "scripted", "input": "2+2?", "tool_timeout": 31})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tool_timeout"


def test_a_request_runs_at_most_its_share_of_sandbox_cells_whatever_its_n(make_server):
    calling, answer = TOOL_TURNS
    client, http, _, _ = make_server(replies=(calling, calling, calling, answer))
    sandbox = sandbox_of(http)
    sandbox.delay_s = 0.2
    completion = client.chat.completions.create(model="scripted", messages=QUESTION, n=3)
    assert [len(choice.message.code_cells) for choice in completion.choices] == [1, 1, 1]
    assert sandbox.most_running == 1  # api.sandbox_cells_per_request: the three calls took turns


# -- stop strings and stop token ids --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "field", "value"),
    [
        ("/v1/chat/completions", "stop", ["x"] * 17),
        ("/v1/chat/completions", "stop", "x" * 257),
        ("/v1/completions", "stop", ["ok", "x" * 257]),
        ("/v1/completions", "stop_token_ids", list(range(257))),
    ],
    ids=["17 strings", "a long string", "a long one among others", "257 token ids"],
)
def test_stop_strings_and_stop_token_ids_past_their_bounds_are_a_400_naming_them(make_server, route, field, value):
    _, http, engine, _ = make_server()
    prompt = {"messages": QUESTION} if route == "/v1/chat/completions" else {"prompt": "2+2="}
    response = http.post(route, json={"model": "scripted", **prompt, field: value})
    assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text
    assert engine.prompts == []
    at_the_bounds = {"stop": ["x" * 256] * 16} if field == "stop" else {"stop_token_ids": list(range(256))}
    assert http.post(route, json={"model": "scripted", **prompt, **at_the_bounds}).status_code == 200


# -- conversations kept no longer than the retention ----------------------------------------------------


def _backdate(http, conversation_id: str, days: float) -> None:
    with http.app.state.database() as session:
        conversation = session.get(Conversation, conversation_id)
        conversation.created_at = conversation.updated_at = datetime.now(timezone.utc) - timedelta(days=days)
        session.commit()


def _exported_ids(http) -> set[str]:
    return {json.loads(line)["conversation_id"] for line in http.get("/v1/conversations/export.jsonl").text.splitlines()}


def test_conversations_past_the_retention_are_purged_with_their_trajectories(make_server):
    client, http, _, _ = make_server(conversation_retention_days=0)
    old, continued, recent = (client.chat.completions.create(model="scripted", messages=QUESTION).conversation_id for _ in range(3))
    _backdate(http, old, 31)
    _backdate(http, continued, 31)
    client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"conversation_id": continued})  # an exchange today
    assert http.app.state.serving.store.purge(datetime.now(timezone.utc) - timedelta(days=30)) == 1
    assert http.get(f"/v1/conversations/{old}").status_code == 404
    assert all(http.get(f"/v1/conversations/{kept}").status_code == 200 for kept in (continued, recent))
    assert _exported_ids(http) == {continued, recent}


def test_the_server_purges_old_conversations_when_it_starts(make_server):
    client, http, _, _ = make_server(conversation_retention_days=0)  # 0 keeps them forever
    old, recent = (client.chat.completions.create(model="scripted", messages=QUESTION).conversation_id for _ in range(2))
    _backdate(http, old, 8)
    _, http, _, _ = make_server(conversation_retention_days=7)  # the same database
    wait_for(lambda: http.get(f"/v1/conversations/{old}").status_code == 404, 10, "the old conversation is still stored")
    assert http.get(f"/v1/conversations/{recent}").status_code == 200 and _exported_ids(http) == {recent}


def test_a_conversation_is_its_keys_and_another_key_finds_none(make_server):
    client, http, _, _ = make_server(api_key="key-a")
    stored = client.chat.completions.create(model="scripted", messages=QUESTION).conversation_id
    _, other, _, _ = make_server(api_key="key-b", admin_key="admin")  # the same database, another key
    by_b = {"authorization": "Bearer key-b"}
    continued = {"model": "scripted", "messages": QUESTION, "conversation_id": stored}
    for refused in (
        other.get(f"/v1/conversations/{stored}", headers=by_b),
        other.delete(f"/v1/conversations/{stored}", headers=by_b),
        other.post("/v1/chat/completions", headers=by_b, json=continued),
        other.post("/v1/chat/completions", headers=by_b, json={**continued, "stream": True}),
    ):
        assert refused.status_code == 404 and refused.json()["error"]["param"] == "conversation_id", refused.text
    listed = other.get("/v1/conversations", headers={"authorization": "Bearer admin"}).json()["data"]
    assert [c["id"] for c in listed] == [stored]  # the admin's list is everyone's
    assert http.get(f"/v1/conversations/{stored}", headers={"authorization": "Bearer key-a"}).status_code == 200
    with http.app.state.database() as session:
        owner = session.get(Conversation, stored).owner
    assert len(owner) == 64 and "key-a" not in owner  # a digest: the database holds no key
