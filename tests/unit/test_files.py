"""The Files API subset through the official `openai` client, on `build_app`'s routes (no engine: the lifespan
is not run): the lifecycle, ownership by key, limits and bad uploads, each refused naming its field."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient

from tests.unit.api_server import routes_client


def _client(tmp_path, key: str, api: dict | None = None, **files) -> openai.OpenAI:
    return routes_client(tmp_path, key, files=files, api=api)


@pytest.fixture
def client(tmp_path):
    return _client(tmp_path, "key-a")


def test_file_lifecycle_as_the_openai_client_sees_it(client):
    csv = b"amount\n30\n12\n"
    uploaded = client.files.create(file=("sales.csv", csv), purpose="user_data")
    assert uploaded.id.startswith("file-") and len(uploaded.id) == 5 + 32
    assert (uploaded.object, uploaded.bytes, uploaded.filename, uploaded.purpose, uploaded.status) == ("file", len(csv), "sales.csv", "user_data", "processed")
    assert client.files.retrieve(uploaded.id) == uploaded
    assert client.files.content(uploaded.id).read() == csv
    other = client.files.create(file=("notes.txt", b"hi"), purpose="assistants")
    assert [f.id for f in client.files.list()] == [other.id, uploaded.id]  # newest first, as OpenAI lists
    assert [f.id for f in client.files.list(purpose="user_data")] == [uploaded.id]
    assert [f.id for f in client.files.list(order="asc", limit=1)] == [uploaded.id, other.id]  # the SDK follows the cursor
    deleted = client.files.delete(uploaded.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (uploaded.id, "file", True)
    with pytest.raises(openai.NotFoundError) as gone:
        client.files.retrieve(uploaded.id)
    assert gone.value.body["param"] == "file_id"


def test_another_keys_file_is_a_404_and_stays_untouched(tmp_path, client):
    mine = client.files.create(file=("a.txt", b"secret"), purpose="user_data")
    other = _client(tmp_path, "key-b")
    assert list(other.files.list()) == []
    for call in (lambda: other.files.retrieve(mine.id), lambda: other.files.content(mine.id), lambda: other.files.delete(mine.id)):
        with pytest.raises(openai.NotFoundError) as refused:
            call()
        assert refused.value.body["param"] == "file_id"
    assert client.files.content(mine.id).read() == b"secret"


@pytest.mark.parametrize(
    ("limits", "sizes", "status", "param", "says"),
    [
        ({"max_file_bytes": 10}, [11], 413, "file", "files.max_file_bytes"),
        ({"max_bytes_per_key": 15}, [8, 8], 413, "file", "files.max_bytes_per_key"),
        ({"max_per_key": 1}, [1, 1], 429, "files", "1"),
    ],
)
def test_each_limit_is_an_openai_shaped_refusal_naming_its_field(tmp_path, limits, sizes, status, param, says):
    client = _client(tmp_path, "key-a", **limits)
    with pytest.raises(openai.APIStatusError) as refused:
        for i, size in enumerate(sizes):
            client.files.create(file=(f"{i}.txt", b"x" * size), purpose="user_data")
    assert (refused.value.status_code, refused.value.body["param"]) == (status, param) and says in refused.value.message
    assert len(list(client.files.list())) == len(sizes) - 1
    assert [p.name for p in (tmp_path / "files").iterdir()] == [f.id for f in client.files.list()]  # nothing half-stored


def test_an_upload_body_is_bounded_by_the_file_cap_not_the_json_body_cap(tmp_path):
    client = _client(tmp_path, "key-a", api={"max_body_bytes": 1000}, max_file_bytes=100_000)
    assert client.files.create(file=("ok.bin", b"x" * 50_000), purpose="user_data").bytes == 50_000
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.bin", b"x" * 200_000), purpose="user_data")
    assert refused.value.status_code == 413 and "files.max_file_bytes" in refused.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"files": {"file": ("a.txt", b"x")}, "data": {"purpose": "nonsense"}}, "purpose"),
        ({"files": {"file": ("a.txt", b"x")}}, "purpose"),
        ({"data": {"purpose": "user_data"}}, "file"),
        ({"content": b"no boundary", "headers": {"content-type": "multipart/form-data"}}, "file"),
    ],
)
def test_a_bad_upload_is_a_400_naming_its_field(client, body, param):
    http: TestClient = client._client
    headers = {"authorization": "Bearer key-a", **body.pop("headers", {})}
    answer = http.post("/v1/files", headers=headers, **body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.json()


def test_an_id_that_is_not_a_file_id_is_a_404(client):
    for bad in ("file-../../containers", "file-" + "0" * 32):
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(bad)


def test_without_the_key_nothing_is_answered(client):
    assert client._client.get("/v1/files").status_code == 401
