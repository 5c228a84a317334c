"""The API app on a scripted engine and a scripted sandbox, driven by the official openai client over
Starlette's TestClient: the fixture the unit-tier API tests share."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient

from rstar.app import build_app
from rstar.config import load_settings
from tests.scripted_engine import ScriptedEngine, call
from tests.scripted_sandbox import ScriptedSandbox

REPLY = "Two plus two is 4."
QUESTION = [{"role": "user", "content": "What is 6*7?"}]
# One built-in call, then the answer that reads its result.
TOOL_TURNS = ("<reason>Let me compute.</reason>\n" + call("print(6*7)"), "<reason>The tool says 42.</reason>The answer is 42.")


def routes_client(tmp_path, key: str, **settings_overrides) -> openai.OpenAI:
    """The openai client, sending `key`, on `build_app`'s routes alone: the lifespan is not run, so there is no
    engine and no sandbox (for the routes that need neither: containers, files)."""

    async def no_engine():
        raise AssertionError("these tests run no lifespan")

    settings = load_settings(data_dir=tmp_path, api_key=key, **settings_overrides)
    http = TestClient(build_app(settings, no_engine, "scripted"))
    return openai.OpenAI(api_key=key, base_url="http://testserver/v1", http_client=http, max_retries=0)


def sandbox_of(http):
    return http.app.state.serving.sandbox


@pytest.fixture
def make_server(tmp_path, default_tokenizer):
    """Start the app on a scripted engine and sandbox; yields (openai client, test client, engine, settings).

    The sandbox is `http.app.state.serving.sandbox`."""
    opened = []

    def start(replies=(REPLY,), sandbox=None, max_model_len=1024, model_name="scripted", tokenizer=None, **settings_overrides):
        settings = load_settings(data_dir=tmp_path, **settings_overrides)
        engine = ScriptedEngine(tokenizer or default_tokenizer, list(replies), model_name=model_name, max_model_len=max_model_len)
        sandbox = sandbox or ScriptedSandbox()

        async def factory():
            return engine

        # A loopback Host, as a local client sends: a server without a key answers only those.
        http = TestClient(build_app(settings, factory, model_name, sandbox_factory=lambda: sandbox), base_url="http://localhost")
        http.__enter__()
        opened.append(http)
        client = openai.OpenAI(base_url="http://localhost/v1", api_key=settings.api_key or "none", http_client=http, max_retries=0)
        return client, http, engine, settings

    yield start
    for http in opened:
        http.__exit__(None, None, None)


