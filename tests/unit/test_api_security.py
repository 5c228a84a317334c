"""What a hostile client cannot do to the API: supply a template, hold the event loop with a render, get in
without the key. On a scripted engine and sandbox (the live-server check is tests/integration/test_api_live.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.unit.api_server import make_server  # noqa: F401 (fixture)

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
    from rstar.server.api import serve_refusal

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
    assert http.get("/v1/models", headers={"host": "api.example.com", "authorization": "Bearer "}).status_code == 401


def test_the_conversation_list_and_export_need_the_admin_key_when_there_is_one(make_server):
    client, http, _, _ = make_server(api_key="chat", admin_key="admin")
    client.chat.completions.create(model="scripted", messages=QUESTION)
    chat, admin = {"authorization": "Bearer chat"}, {"authorization": "Bearer admin"}
    for path in ("/v1/conversations", "/v1/conversations/export.jsonl"):
        assert http.get(path, headers=chat).status_code == 401, path
        assert http.get(path, headers=admin).status_code == 200, path
    listed = http.get("/v1/conversations", headers=admin).json()["data"]
    assert http.get(f"/v1/conversations/{listed[0]['id']}", headers=chat).status_code == 200  # its id is what the client was given
