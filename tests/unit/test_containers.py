"""The Containers API subset through the official `openai` client, on `build_app`'s routes (no engine: the
lifespan is not run), and the store's limits, expiry and ownership."""

from __future__ import annotations

import io
import time

import openai
import pytest
from fastapi.testclient import TestClient

from rstar.config import load_settings
from rstar.server.containers import ContainerStore, safe_name
from rstar.server.errors import APIError
from rstar.server.schemas_containers import ContainerCreate
from tests.unit.api_server import routes_client


def _client(tmp_path, key: str, api: dict | None = None, **containers) -> openai.OpenAI:
    return routes_client(tmp_path, key, containers=containers, api=api)


@pytest.fixture
def client(tmp_path):
    return _client(tmp_path, "key-a")


def test_container_and_file_lifecycle_as_the_openai_client_sees_it(client, tmp_path):
    container = client.containers.create(name="sales", expires_after={"anchor": "last_active_at", "minutes": 5}, memory_limit="1g")
    assert container.id.startswith("cntr_") and len(container.id) == 5 + 32 and container.object == "container"
    assert (container.name, container.expires_after.minutes, container.memory_limit, container.status) == ("sales", 5, "1g", "active")
    assert client.containers.retrieve(container.id).id == container.id
    assert [c.id for c in client.containers.list()] == [container.id]

    csv = b"x,y\n1,2\n3,4\n"
    uploaded = client.containers.files.create(container.id, file=("data.csv", csv))
    assert (uploaded.object, uploaded.path, uploaded.bytes, uploaded.source, uploaded.container_id) == ("container.file", "/mnt/data/data.csv", len(csv), "user", container.id)
    assert client.containers.files.content.retrieve(uploaded.id, container_id=container.id).read() == csv

    # What code writes into the container's directory is listed as the assistant's, and downloads as written.
    written = bytes(range(256)) * 40
    (tmp_path / "containers" / container.id / "data" / "out.bin").write_bytes(written)
    files = {f.path: f for f in client.containers.files.list(container.id)}
    assert files["/mnt/data/out.bin"].source == "assistant" and files["/mnt/data/out.bin"].bytes == len(written)
    out = files["/mnt/data/out.bin"]
    assert client.containers.files.retrieve(out.id, container_id=container.id).path == "/mnt/data/out.bin"
    assert client.containers.files.content.retrieve(out.id, container_id=container.id).read() == written

    client.containers.files.delete(uploaded.id, container_id=container.id)
    assert [f.path for f in client.containers.files.list(container.id)] == ["/mnt/data/out.bin"]
    client.containers.delete(container.id)
    with pytest.raises(openai.NotFoundError):
        client.containers.retrieve(container.id)
    assert not (tmp_path / "containers" / container.id).exists()


def test_list_pages_with_cursors(client):
    ids = [client.containers.create(name=f"c{i}").id for i in range(3)]
    first = client.containers.list(limit=2, order="asc")
    assert [c.id for c in first.data] == ids[:2] and first.has_more and first.last_id == ids[1]
    assert [c.id for c in client.containers.list(limit=2, order="asc", after=ids[1]).data] == ids[2:]
    assert [c.id for c in client.containers.list(limit=2, order="asc")] == ids  # the SDK follows the cursor


def test_another_keys_container_is_a_404_and_stays_untouched(tmp_path, client):
    container = client.containers.create(name="mine")
    client.containers.files.create(container.id, file=("a.txt", b"secret"))
    other = _client(tmp_path, "key-b")
    assert list(other.containers.list()) == []
    for call in (
        lambda: other.containers.retrieve(container.id),
        lambda: other.containers.files.list(container.id),
        lambda: other.containers.files.create(container.id, file=("b.txt", b"intruder")),
        lambda: other.containers.delete(container.id),
    ):
        with pytest.raises(openai.NotFoundError) as refused:
            call()
        assert refused.value.body["param"] == "container_id"
    assert [f.path for f in client.containers.files.list(container.id)] == ["/mnt/data/a.txt"]


def test_an_expired_container_is_gone_and_purged(client, tmp_path):
    container = client.containers.create(name="short", expires_after={"anchor": "last_active_at", "minutes": 1})
    store: ContainerStore = client._client.app.state.containers
    assert store.purge_expired() == []
    assert store.purge_expired(now=time.time() + 61) == [container.id]
    assert not (tmp_path / "containers" / container.id).exists()
    with pytest.raises(openai.NotFoundError):
        client.containers.retrieve(container.id)


@pytest.mark.parametrize(
    ("limits", "act", "status", "param"),
    [
        ({"max_file_bytes": 10}, lambda c, cid: c.containers.files.create(cid, file=("big.txt", b"x" * 11)), 413, "file"),
        ({"max_bytes": 15}, lambda c, cid: [c.containers.files.create(cid, file=(f"{i}.txt", b"x" * 8)) for i in range(2)], 413, "file"),
        ({"max_files": 1}, lambda c, cid: [c.containers.files.create(cid, file=(f"{i}.txt", b"x")) for i in range(2)], 400, "file"),
        ({"max_per_key": 1}, lambda c, cid: c.containers.create(name="second"), 429, "containers"),
        ({"max_memory_limit": "4g"}, lambda c, cid: c.containers.create(name="huge", memory_limit="16g"), 400, "memory_limit"),
    ],
)
def test_each_limit_is_an_openai_shaped_refusal_naming_its_field(tmp_path, limits, act, status, param):
    client = _client(tmp_path, "key-a", **limits)
    container = client.containers.create(name="c")
    with pytest.raises(openai.APIStatusError) as refused:
        act(client, container.id)
    assert refused.value.status_code == status and refused.value.body["param"] == param
    assert sum(f.bytes for f in client.containers.files.list(container.id)) <= limits.get("max_bytes", 10**9)
    assert not list((tmp_path / "containers" / container.id / "data").glob(".*.part"))  # no half-written file left


def test_an_upload_body_is_bounded_by_the_file_cap_not_the_json_body_cap(tmp_path):
    client = _client(tmp_path, "key-a", api={"max_body_bytes": 1000}, max_file_bytes=100_000)
    container = client.containers.create(name="c")
    assert client.containers.files.create(container.id, file=("ok.bin", b"x" * 50_000)).bytes == 50_000  # past the JSON cap
    with pytest.raises(openai.APIStatusError) as refused:
        client.containers.files.create(container.id, file=("big.bin", b"x" * 200_000))  # past the file cap and its framing
    assert refused.value.status_code == 413 and "containers.max_file_bytes" in refused.value.message


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"content-type": "multipart/form-data; boundary=zzz"}, b"--zzz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nabc"),
        ({"content-type": "multipart/form-data"}, b"no boundary"),
        ({"content-type": "application/json"}, b'{"file_id": "file_1"}'),
    ],
)
def test_a_malformed_or_fileless_upload_is_a_400_naming_file(client, headers, body):
    container = client.containers.create(name="c")
    http: TestClient = client._client
    answer = http.post(f"/v1/containers/{container.id}/files", content=body, headers={**headers, "authorization": "Bearer key-a"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "file"


def test_without_the_key_nothing_is_answered(client):
    answer = client._client.get("/v1/containers")
    assert answer.status_code == 401


@pytest.mark.parametrize("name", ["../../etc/passwd", "dir/../meta.json", "..", ""])
def test_an_upload_name_cannot_leave_the_containers_directory(name):
    try:
        assert "/" not in safe_name(name) and safe_name(name) not in ("..", "meta.json")
    except APIError as refused:
        assert refused.status == 400 and refused.param == "file"


def test_uploads_are_bounded_while_copied(tmp_path):
    store = ContainerStore(tmp_path, load_settings(containers={"max_file_bytes": 5}).containers)
    cid = store.create(ContainerCreate(name="c"), None).id
    with pytest.raises(APIError):
        store.add_file(cid, None, "f", io.BytesIO(b"123456"))
    assert store.add_file(cid, None, "f", io.BytesIO(b"12345")).bytes == 5


def test_a_symlink_or_fifo_code_leaves_in_the_data_dir_is_neither_listed_nor_served(client, tmp_path, monkeypatch):
    import os

    container = client.containers.create(name="c")
    data = tmp_path / "containers" / container.id / "data"
    os.symlink("/etc/hostname", data / "host.txt")
    os.mkfifo(data / "pipe")
    assert list(client.containers.files.list(container.id)) == []
    # Listed as a regular file, then swapped for a symlink before its bytes are read: not served.
    listed = client.containers.files.create(container.id, file=("swap.txt", b"mine"))
    (data / "swap.txt").unlink()
    os.symlink("/etc/hostname", data / "swap.txt")
    store: ContainerStore = client._client.app.state.containers
    monkeypatch.setattr(store, "file", lambda *_: listed)
    with pytest.raises(openai.NotFoundError):
        client.containers.files.content.retrieve(listed.id, container_id=container.id)
