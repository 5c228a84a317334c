"""Fixtures every tier shares: the repo, the embedded default model, and one real engine per session.

The engine lives on an event loop in its own thread (AsyncLLM stays on the loop it started on, while
pytest's tests are plain functions); tests submit coroutines with `loop_thread.run`. `live_server` serves
the real API app on that same engine over real HTTP, so engine, API and browser tests share one engine.
Nothing starts an engine unless a test asks for `engine` or `live_server`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rstar.config import EngineSettings, Settings, load_settings
from tests.loop_thread import LoopThread

REPO_ROOT = Path(__file__).resolve().parent.parent

def pytest_collection_modifyitems(items) -> None:
    """Mark every test that needs the real engine (everything under tests/integration, and any test that asks for
    the session's engine or live server, the browser tests too), so `-m "not integration"` means "no engine"."""
    for item in items:
        if "integration" in item.path.parts or {"engine", "live_server"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_behind():
    """Engines some tests kill on purpose leave their shared memory in /dev/shm; it goes when the session ends."""
    from tests.processes import remove_orphaned_shared_memory

    started = time.time()
    yield
    remove_orphaned_shared_memory(started)


# No test may reach a model or dataset hub; fail fast instead of retrying for half a minute.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


# The name the session engine serves the default model under (what `rstar serve` calls it).
DEFAULT_MODEL_NAME = "SmolLM2-135M-rStar-Tool"


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded default model (the base merged with the shipped tool-use delta), pulled into the user
    cache for real (a no-op once cached)."""
    from rstar.server.model_store import resolve_model

    return Path(resolve_model("default", load_settings().models_dir).path)


@pytest.fixture(scope="session")
def base_model_dir(default_model_dir) -> Path:
    """The untuned SmolLM2-135M-Instruct the default is made from (pulled with it)."""
    from rstar.server.model_store import resolve_model

    return Path(resolve_model("smollm2-135m-instruct", load_settings().models_dir, pull=False).path)


@pytest.fixture(scope="session")
def default_tokenizer(base_model_dir):
    """SmolLM2's tokenizer with SmolLM2's own chat template (the tuned default shares the vocabulary but
    carries the rStar template it was trained on)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model_dir)


@pytest.fixture(scope="session")
def loop_thread():
    runner = LoopThread()
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def engine(default_model_dir, loop_thread):
    from rstar.server.engine import VllmEngine

    # Tests check behaviour, not speed: eager starts in about a minute where compiling takes several.
    engine = loop_thread.run(VllmEngine.start(default_model_dir, EngineSettings(max_model_len=8192, max_num_seqs=16, enforce_eager=True), DEFAULT_MODEL_NAME))
    yield engine
    loop_thread.run(engine.shutdown())


@pytest.fixture
def restore_engine_weights(engine, loop_thread, default_model_dir):
    """For tests that train on the session engine: the default model's weights are back afterwards."""
    yield
    if engine.weight_version:
        loop_thread.run(engine.reload_weights(default_model_dir))


@dataclass
class LiveServer:
    base_url: str  # http://127.0.0.1:PORT
    settings: Settings
    app: Any  # the FastAPI app; app.state.serving holds the engine, the sandbox client and the store


@pytest.fixture(scope="session")
def live_server(engine, loop_thread, tmp_path_factory):
    """The API app on the session engine, served by uvicorn on a free loopback port, with its own
    in-process sandbox pool (the server's default), which the app starts and stops."""
    import uvicorn

    from rstar.app import build_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    settings = load_settings(data_dir=tmp_path_factory.mktemp("server-data"), port=port, enable_rl=True)

    async def shared_engine():
        return engine

    app = build_app(settings, shared_engine, engine.model_name)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.run_coroutine_threadsafe(server.serve(sockets=[sock]), loop_thread.loop)
    deadline = time.time() + 60
    while not server.started:
        assert not serving.done(), f"server failed to start: {serving.exception()}"
        assert time.time() < deadline, "server did not start in 60 s"
        time.sleep(0.05)
    yield LiveServer(f"http://127.0.0.1:{port}", settings, app)
    server.should_exit = True
    serving.result(60)
