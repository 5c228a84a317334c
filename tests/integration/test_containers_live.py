"""Containers on the live server with the official openai client (issue 26): a forced cell in a container reads
the uploaded CSV and gets the right number, the file it wrote downloads byte-identical, another key gets a 404
for the container, and an expired one is gone. The cell is forced (the last assistant message holds the call
and is continued) through chat completions' `container`, so the test does not depend on the small model's code;
the Responses tool on a container, with its citations, is the same path (tests/unit/test_responses_containers.py)."""

from __future__ import annotations

import json
import time

import openai
import pytest
from fastapi.testclient import TestClient

from rstar.app import build_app
from rstar.config import load_settings
from rstar.sandbox.tools import PYTHON_TOOL
from tests.conftest import DEFAULT_MODEL_NAME

CODE = ("import csv\ntotal = sum(int(r['amount']) for r in csv.DictReader(open('/mnt/data/sales.csv')))\n"
        "open('/mnt/data/total.bin', 'wb').write(bytes(range(256)) * 4 + str(total).encode())\nprint(total)")
CALL = json.dumps({"name": PYTHON_TOOL, "arguments": {"code": CODE, "input": ""}})
FORCED = [{"role": "user", "content": "Sum the amounts."}, {"role": "assistant", "content": f"I will sum them.\n<tool_call>\n{CALL}\n</tool_call>"}]


def test_a_container_s_cell_reads_the_upload_and_its_file_downloads_byte_identical(live_server):
    client = openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0)
    container = client.containers.create(name="sales", expires_after={"anchor": "last_active_at", "minutes": 1})
    client.containers.files.create(container.id, file=("sales.csv", b"amount\n1200\n34\n-5\n"))
    completion = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, messages=FORCED, max_tokens=16, temperature=0,
        extra_body={"continue_final_message": True, "container": container.id, "tool_timeout": 30},
    )
    cell = completion.choices[0].message.code_cells[0]
    assert (cell["status"], cell["stdout"]) == ("ok", "1229\n"), cell
    files = {f.path: f for f in client.containers.files.list(container.id)}
    written = files["/mnt/data/total.bin"]
    assert written.source == "assistant"
    assert client.containers.files.content.retrieve(written.id, container_id=container.id).read() == bytes(range(256)) * 4 + b"1229"

    # Another key, on the same data: the container is not there for it.
    settings = load_settings(data_dir=live_server.settings.data_dir, api_key="key-b")
    other = openai.OpenAI(api_key="key-b", base_url="http://testserver/v1", http_client=TestClient(build_app(settings, None, "x")), max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.containers.retrieve(container.id)

    # Expired (a minute past its last activity), it is gone with its files.
    store = live_server.app.state.containers
    assert container.id in store.purge_expired(now=time.time() + 61)
    with pytest.raises(openai.NotFoundError):
        client.containers.retrieve(container.id)
    assert not (live_server.settings.containers_dir / container.id).exists()
