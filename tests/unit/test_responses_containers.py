"""The Responses code_interpreter tool on a container (issue 26): its cells are sent to the sandbox in that
container with its memory cap, the calls name it, and a container that is unknown or another key's is a 404
naming the field; on the scripted engine and sandbox."""

from __future__ import annotations

import time

import openai
import pytest

from rstar.server.containers import purge_expired
from tests.scripted_engine import call
from tests.unit.api_server import TOOL_TURNS, make_server  # noqa: F401 (fixture)


def test_cells_run_in_the_named_container_with_its_memory_limit(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS, api_key="key-a")
    container = client.containers.create(name="c", memory_limit="4g")
    response = client.responses.create(model="scripted", input="What is 6*7?", tools=[{"type": "code_interpreter", "container": container.id}])
    calls = [item for item in response.output if item.type == "code_interpreter_call"]
    assert [call.container_id for call in calls] == [container.id]
    sent = http.app.state.serving.sandbox.requests
    assert [(r.container_id, r.memory_mb, r.history) for r in sent] == [(container.id, 4096, [])]


def test_without_a_container_cells_run_alone(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS)
    client.responses.create(model="scripted", input="What is 6*7?", tools=[{"type": "code_interpreter", "container": {"type": "auto"}}])
    assert [r.container_id for r in http.app.state.serving.sandbox.requests] == [None]


@pytest.mark.parametrize("whose", ["unknown", "another key's"])
def test_an_unknown_or_another_key_s_container_is_a_404_naming_the_field(make_server, whose):
    owner, _, _, _ = make_server(api_key="key-a")
    container_id = owner.containers.create(name="mine").id if whose == "another key's" else "cntr_" + "0" * 32
    client, http, _, _ = make_server(replies=TOOL_TURNS, api_key="key-b")
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(model="scripted", input="hi", tools=[{"type": "function", "name": "f"}, {"type": "code_interpreter", "container": container_id}])
    assert refused.value.body["param"] == "tools.1.container" and container_id in refused.value.message
    assert http.app.state.serving.sandbox.requests == []


CSV_CODE = ("import csv\nrows = list(csv.DictReader(open('/mnt/data/sales.csv')))\ntotal = sum(int(r['amount']) for r in rows)\n"
            "open('/mnt/data/total.txt', 'w').write(f'{total}\\n')\nprint(total)")


def test_on_the_real_sandbox_the_code_reads_the_upload_and_its_file_downloads_as_written(make_server, tmp_path):
    from rstar.sandbox.clients import LocalClient
    from rstar.sandbox.settings import SandboxSettings

    sandbox = LocalClient(SandboxSettings(workers=1, spare_cells=1, max_sessions=2, uid_base=62100, containers_dir=str(tmp_path / "containers")))
    replies = ("<reason>Sum it.</reason>\n" + call(CSV_CODE), "The total is 42, saved in sandbox:/mnt/data/total.txt.")
    client, _, _, _ = make_server(replies=replies, sandbox=sandbox, api_key="key-a")
    container = client.containers.create(name="sales")
    client.containers.files.create(container.id, file=("sales.csv", b"amount\n30\n12\n"))
    response = client.responses.create(model="scripted", input="Total?", tools=[{"type": "code_interpreter", "container": container.id}])
    cell = next(item for item in response.output if item.type == "code_interpreter_call")
    assert (cell.status, cell.outputs[0].logs, cell.container_id) == ("completed", "42\n", container.id), cell
    files = {f.path: f for f in client.containers.files.list(container.id)}
    assert (files["/mnt/data/sales.csv"].source, files["/mnt/data/total.txt"].source) == ("user", "assistant")
    assert client.containers.files.content.retrieve(files["/mnt/data/total.txt"].id, container_id=container.id).read() == b"42\n"
    # Both are cited: the one the code read (at 0..0, the text does not name it) and the one it wrote, where the text links it.
    message = [item for item in response.output if item.type == "message"][-1].content[0]
    cited = {(a.filename, a.file_id, a.container_id, message.text[a.start_index : a.end_index]) for a in message.annotations}
    assert cited == {("sales.csv", files["/mnt/data/sales.csv"].id, container.id, ""),
                     ("total.txt", files["/mnt/data/total.txt"].id, container.id, "sandbox:/mnt/data/total.txt")}


def test_a_chat_completion_may_name_a_container_too(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS, api_key="key-a")
    container = client.containers.create(name="chat", memory_limit="1g")
    client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "6*7?"}], extra_body={"container": container.id})
    assert [(r.container_id, r.memory_mb) for r in http.app.state.serving.sandbox.requests] == [(container.id, 1024)]
    for bad, status in (("cntr_" + "0" * 32, 404), ("../etc", 400)):
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], extra_body={"container": bad})
        assert (refused.value.status_code, refused.value.body["param"]) == (status, "container")


def test_deleting_or_expiring_a_container_stops_its_interpreter(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS * 2, api_key="key-a")
    sandbox = http.app.state.serving.sandbox
    deleted, expiring = (client.containers.create(name=name, expires_after={"anchor": "last_active_at", "minutes": 1}) for name in ("deleted", "expiring"))
    client.containers.delete(deleted.id)
    purged = http.portal.call(purge_expired, http.app.state.containers, sandbox, time.time() + 61)
    assert (purged, sandbox.closed_containers) == ([expiring.id], [deleted.id, expiring.id])


def test_on_the_real_sandbox_no_interpreter_outlives_its_container(make_server, tmp_path):
    from rstar.sandbox.clients import LocalClient
    from rstar.sandbox.settings import SandboxSettings

    sandbox = LocalClient(SandboxSettings(workers=1, spare_cells=1, max_sessions=2, uid_base=62200, containers_dir=str(tmp_path / "containers")))
    client, http, _, _ = make_server(replies=TOOL_TURNS * 2, sandbox=sandbox, api_key="key-a")

    def sessions() -> int:
        return [p["role"] for p in http.portal.call(sandbox.pool.processes)].count("session")

    def run_a_cell(container_id: str) -> None:
        client.responses.create(model="scripted", input="6*7?", tools=[{"type": "code_interpreter", "container": container_id}])

    deleted, expiring = (client.containers.create(name=name, expires_after={"anchor": "last_active_at", "minutes": 1}) for name in ("deleted", "expiring"))
    run_a_cell(deleted.id)
    run_a_cell(expiring.id)
    assert sessions() == 2
    client.containers.delete(deleted.id)
    assert sessions() == 1
    http.portal.call(purge_expired, http.app.state.containers, sandbox, time.time() + 61)
    assert sessions() == 0


def test_auto_with_file_ids_runs_the_cells_in_a_fresh_container_of_the_key_holding_those_files(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS, api_key="key-a")
    csv = client.files.create(file=("sales.csv", b"amount\n30\n12\n"), purpose="user_data")
    notes = client.files.create(file=("notes.txt", b"hi"), purpose="user_data")
    auto = {"type": "auto", "file_ids": [csv.id, notes.id], "memory_limit": "4g"}
    response = client.responses.create(model="scripted", input="Total?", tools=[{"type": "code_interpreter", "container": auto}])
    (made,) = client.containers.list()
    assert [item.container_id for item in response.output if item.type == "code_interpreter_call"] == [made.id]
    assert [(r.container_id, r.memory_mb) for r in http.app.state.serving.sandbox.requests] == [(made.id, 4096)]
    files = {f.path: client.containers.files.content.retrieve(f.id, container_id=made.id).read() for f in client.containers.files.list(made.id)}
    assert files == {"/mnt/data/sales.csv": b"amount\n30\n12\n", "/mnt/data/notes.txt": b"hi"}


@pytest.mark.parametrize("whose", ["unknown", "another key's"])
def test_an_unknown_or_another_key_s_file_is_a_404_naming_its_place_and_makes_nothing(make_server, whose):
    owner, _, _, _ = make_server(api_key="key-a")
    stranger = owner.files.create(file=("theirs.txt", b"x"), purpose="user_data").id if whose == "another key's" else "file-" + "0" * 32
    client, http, _, _ = make_server(replies=TOOL_TURNS, api_key="key-b")
    mine = client.files.create(file=("mine.txt", b"y"), purpose="user_data").id
    tools = [{"type": "function", "name": "f"}, {"type": "code_interpreter", "container": {"type": "auto", "file_ids": [mine, stranger]}}]
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(model="scripted", input="hi", tools=tools)
    assert refused.value.body["param"] == "tools.1.container.file_ids.1" and stranger in refused.value.message
    assert list(client.containers.list()) == [] and http.app.state.serving.sandbox.requests == []


def test_files_the_container_cannot_take_are_refused_naming_the_file_and_leave_no_container(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS, api_key="key-a", containers={"max_bytes": 10})
    ids = [client.files.create(file=(f"{i}.txt", b"x" * 6), purpose="user_data").id for i in range(2)]
    with pytest.raises(openai.APIStatusError) as refused:
        client.responses.create(model="scripted", input="hi", tools=[{"type": "code_interpreter", "container": {"type": "auto", "file_ids": ids}}])
    assert (refused.value.status_code, refused.value.body["param"]) == (413, "tools.0.container.file_ids.1")
    assert list(client.containers.list()) == [] and http.app.state.serving.sandbox.requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_turned_away_at_capacity_leaves_no_container_behind(make_server, stream):
    client, http, engine, _ = make_server(replies=("slow " * 40,), api_key="key-a", api={"max_running_requests": 1, "max_waiting_requests": 0})
    engine.token_delay_s = 0.05
    csv = client.files.create(file=("sales.csv", b"amount\n30\n"), purpose="user_data")
    busy = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], stream=True)
    next(iter(busy))  # holds the only running slot
    with pytest.raises(openai.RateLimitError):
        client.responses.create(model="scripted", input="Total?", stream=stream, tools=[{"type": "code_interpreter", "container": {"type": "auto", "file_ids": [csv.id]}}])
    busy.close()
    assert list(client.containers.list()) == []


def test_on_the_real_sandbox_the_code_reads_a_file_handed_by_id(make_server, tmp_path):
    from rstar.sandbox.clients import LocalClient
    from rstar.sandbox.settings import SandboxSettings

    sandbox = LocalClient(SandboxSettings(workers=1, spare_cells=1, max_sessions=2, uid_base=62300, containers_dir=str(tmp_path / "containers")))
    client, _, _, _ = make_server(replies=("<reason>Sum it.</reason>\n" + call(CSV_CODE), "The total is 42."), sandbox=sandbox, api_key="key-a")
    csv = client.files.create(file=("sales.csv", b"amount\n30\n12\n"), purpose="user_data")
    response = client.responses.create(model="scripted", input="Total?", tools=[{"type": "code_interpreter", "container": {"type": "auto", "file_ids": [csv.id]}}])
    cell = next(item for item in response.output if item.type == "code_interpreter_call")
    assert (cell.status, cell.outputs[0].logs) == ("completed", "42\n"), cell
    written = next(f for f in client.containers.files.list(cell.container_id) if f.path == "/mnt/data/total.txt")
    assert client.containers.files.content.retrieve(written.id, container_id=cell.container_id).read() == b"42\n"
