"""`rstar serve` as a user starts it, answering the official openai client; then a clean stop."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.conftest import DEFAULT_MODEL_NAME
from sqlalchemy import select

from rstar.hardware import accelerator, cpu_info
from rstar.server.db import Conversation, open_database
from rstar.server.engine_defaults import choose_eager
from tests.processes import free_port, start_logged


@pytest.fixture(scope="module")
def sandbox_service(tmp_path_factory):
    """`rstar sandbox serve`, started on its own, as a deployment runs it beside the API."""
    port = free_port()
    log_dir = tmp_path_factory.mktemp("sandbox-service")
    url = f"http://127.0.0.1:{port}"
    process = start_logged([sys.executable, "-m", "rstar.cli", "sandbox", "serve", "--port", str(port)], dict(os.environ), log_dir / "sandbox.log", f"{url}/health")
    yield url
    process.terminate()
    process.wait(30)


@pytest.fixture(scope="module")
def rstar_serve(tmp_path_factory, default_model_dir, sandbox_service):
    """`rstar serve --sandbox-url` against the separately started sandbox service."""
    port = free_port()
    data_dir = tmp_path_factory.mktemp("serve-data")
    # The engine defaults the README's `rstar serve` gets (compiled where the CPU vectorizes: about 95 s on a first
    # start here, 30 s once its compile cache exists), so the default path is the tested one.
    env = {**os.environ, "RSTAR_DATA_DIR": str(data_dir), "RSTAR_ENGINE__MAX_MODEL_LEN": "2048"}
    base_url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "rstar.cli", "serve", "--port", str(port), "--sandbox-url", sandbox_service]
    process = start_logged(command, env, data_dir / "serve.log", f"{base_url}/health")
    yield process, base_url, data_dir
    if process.poll() is None:
        process.kill()


def test_models_lists_the_default_model(rstar_serve):
    _, base_url, _ = rstar_serve
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == [DEFAULT_MODEL_NAME]


def test_openai_client_chat_completion(rstar_serve):
    _, base_url, data_dir = rstar_serve
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    completion = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=24, temperature=0
    )
    choice = completion.choices[0]
    assert choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert 0 < completion.usage.completion_tokens <= 24
    sessions = open_database(f"sqlite:///{data_dir / 'rstar.db'}")
    with sessions() as session:
        stored = session.scalars(select(Conversation)).all()
        assert any(c.messages[-1].content == choice.message.content for c in stored)


def test_openai_client_streaming(rstar_serve):
    _, base_url, _ = rstar_serve
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=[{"role": "user", "content": "Count from one to five."}],
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    # The default model opens with its reasoning, which streams as reasoning_content.
    text_chunks = [c for c in chunks if c.choices and (c.choices[0].delta.content or getattr(c.choices[0].delta, "reasoning_content", None))]
    assert len(text_chunks) > 1
    assert chunks[-1].usage.completion_tokens == 20 or chunks[-2].choices[0].finish_reason == "stop"


def sandbox_calls(sandbox_url: str) -> float:
    """Calls the sandbox service answered, all statuses, from its own /metrics."""
    lines = httpx.get(f"{sandbox_url}/metrics", timeout=10).text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("rstar_sandbox_calls_total{"))


def test_model_code_runs_in_the_separately_started_sandbox(rstar_serve, sandbox_service):
    _, base_url, _ = rstar_serve
    before = sandbox_calls(sandbox_service)
    call = '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(6*7)", "input": ""}}\n</tool_call>'
    messages = [{"role": "user", "content": "What is 6*7? Use Python."}, {"role": "assistant", "content": "I will run it.\n" + call}]
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    message = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, messages=messages, max_tokens=80, temperature=0, extra_body={"continue_final_message": True}
    ).choices[0].message
    assert message.code_cells and (message.code_cells[0]["status"], message.code_cells[0]["stdout"]) == ("ok", "42\n"), message
    assert sandbox_calls(sandbox_service) == before + 1  # the service ran it: the API has no sandbox of its own


def test_second_server_on_the_same_port_fails_fast(rstar_serve):
    _, base_url, _ = rstar_serve
    port = base_url.rsplit(":", 1)[1]
    started = time.time()
    result = subprocess.run([sys.executable, "-m", "rstar.cli", "serve", "--port", port], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert time.time() - started < 60  # well before an engine could have loaded


def test_serve_prints_and_serves_the_ui(rstar_serve):
    _, base_url, data_dir = rstar_serve
    log = (data_dir / "serve.log").read_text()
    assert f"UI at {base_url}/ui" in log
    defaults = [line for line in log.splitlines() if "engine defaults: " in line]
    assert len(defaults) == 1  # one line with every choice and its reason
    eager = choose_eager("auto", accelerator(), cpu_info(), compile_cache_present=False).value
    assert ("eager" if eager else "compiled") in defaults[0]
    page = httpx.get(f"{base_url}/ui", follow_redirects=True, timeout=30)
    assert page.status_code == 200 and "<!doctype html>" in page.text.lower()
    # The page's layout is the rstar UI (its chat and eval components), not some other Gradio app.
    config = httpx.get(f"{base_url}/ui/config", timeout=30).text
    assert '"elem_id":"chatbot"' in config and '"elem_id":"sample-trajectory"' in config


def test_ctrl_c_stops_the_server_and_its_engine(rstar_serve):
    process, _, data_dir = rstar_serve
    engine_processes = [p for p in psutil.Process(process.pid).children(recursive=True) if p.name().startswith("VLLM::")]
    assert engine_processes
    started = psutil.Process(process.pid).create_time()

    def left_in_tmp() -> list[str]:  # what the server made in the temp dir: the UI's downloads, the engine's sockets
        tmp = Path(tempfile.gettempdir())
        return sorted(entry.name for entry in tmp.iterdir() if entry.lstat().st_ctime >= started
                      and (entry.name.startswith(("rstar-ui-", "rstar-engine-ipc-")) or stat.S_ISSOCK(entry.lstat().st_mode)))

    assert len(left_in_tmp()) == 2  # one of each while it serves (vLLM's sockets inside the engine's)
    process.send_signal(signal.SIGINT)
    assert process.wait(60) == 128 + signal.SIGINT  # the shell convention for "stopped by Ctrl-C"
    gone, alive = psutil.wait_procs(engine_processes, timeout=30)
    assert not alive
    # uvicorn re-raises the signal, so the process dies before atexit: what goes must go in the app's shutdown.
    assert left_in_tmp() == []
    log = (data_dir / "serve.log").read_text()
    assert "Application shutdown complete" in log and "Traceback" not in log
