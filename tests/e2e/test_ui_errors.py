"""`rstar ui --endpoint URL` as a user starts it, against a server that is not there: the page says so in
words, on load and when a message is sent, and shows no traceback. No engine needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.processes import free_port, wait_until_serving


@pytest.fixture(scope="module")
def ui_without_server(tmp_path_factory):
    dead, port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("ui") / "ui.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "rstar.cli", "ui", "--endpoint", f"http://127.0.0.1:{dead}", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}/ui/"
    wait_until_serving(process, url, log_path, timeout_s=120)
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
