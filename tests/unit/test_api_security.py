"""What a hostile client cannot do to the API: supply a template, hold the event loop with a render, get in
without the key. On a scripted engine and sandbox (the live-server check is tests/integration/test_api_live.py)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from tests.unit.api_server import make_server  # noqa: F401 (fixture)

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
# About 2.5 s of rendering per pass on this machine: long enough that a render on the event loop shows.
SLOW_TEMPLATE = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}"


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
    assert len(latencies) >= 3 and max(latencies) < 0.5, latencies
    assert engine.prompts == []
