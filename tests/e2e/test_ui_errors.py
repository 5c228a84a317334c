"""`rstar ui --endpoint URL` as a user starts it, against a server that is not there: the page says so in
words, on load and when a message is sent, and shows no traceback. No engine needed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def ui_without_server(tmp_path_factory):
    dead, port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("ui") / "ui.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "rstar.cli", "ui", "--endpoint", f"http://127.0.0.1:{dead}", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}/ui/"
    deadline = time.time() + 120
    while True:
        assert process.poll() is None, f"rstar ui exited: {log_path.read_text()[-3000:]}"
        assert time.time() < deadline, "rstar ui did not serve its page in 120 s"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    yield url, dead, log_path
    process.terminate()
    process.wait(30)


def test_rstar_ui_prints_its_url(ui_without_server):
    url, dead, log_path = ui_without_server
    assert f"UI at {url.rstrip('/')} (server: http://127.0.0.1:{dead})" in log_path.read_text()


def test_an_unreachable_server_is_a_message_not_a_traceback(new_page, ui_without_server):
    url, dead, _ = ui_without_server
    page = new_page(url)
    hint = f"Cannot reach the server at http://127.0.0.1:{dead}: is rstar serve running?"  # as rendered (Markdown code, no backticks)
    page.wait_for_function(f"document.querySelector('#server-status').innerText.includes({hint!r})", timeout=30_000)
    page.wait_for_function(f"document.querySelector('#chat-notice').innerText.includes({hint!r})", timeout=30_000)
    page.fill("#chat-input textarea", "Hello?")
    page.click("#send")
    page.wait_for_function(f"document.querySelector('#chatbot').innerText.includes({hint!r})", timeout=30_000)
    page.get_by_role("tab", name="Evaluations").click()
    page.click("#refresh-runs")
    page.wait_for_function(f"document.querySelector('#evals-notice').innerText.includes({hint!r})", timeout=30_000)
    body = page.locator("body").inner_text()
    assert "Traceback" not in body and 'File "' not in body
