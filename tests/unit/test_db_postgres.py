"""The same migrations and models on a real PostgreSQL server (a throwaway cluster started for the module), and
the API storing and exporting real trajectories there."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select

from rstar.sandbox.clients import LocalClient
from rstar.server.db import (
    MIGRATIONS_DIR,
    Conversation,
    EvalRun,
    EvalSample,
    Message,
    StoredTrajectory,
    close_database,
    current_revision,
    make_engine,
    open_database,
)
from tests.unit.api_server import QUESTION, TOOL_TURNS, make_server  # noqa: F401 (fixture)

PORT = 54329


def _server_binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


@pytest.fixture(scope="module")
def postgres_url():
    bindir = _server_binaries()
    if bindir is None or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI must test PostgreSQL: install.sh installs Debian's postgresql as root")
        pytest.skip("no PostgreSQL server binaries (Debian package postgresql) or not root")
    datadir = tempfile.mkdtemp(prefix="rstar-pg-")
    shutil.chown(datadir, "postgres", "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_postgres, f"{bindir}/initdb", "-D", datadir, "-A", "trust", "-U", "rstar"], check=True, capture_output=True)
    # Unix socket only, inside the data dir: nothing listens on the network.
    options = f"-p {PORT} -k {datadir} -c listen_addresses=''"
    # -l: the server keeps its output handles open, so they go to a file, not to a pipe we would wait on.
    subprocess.run([*as_postgres, f"{bindir}/pg_ctl", "-D", datadir, "-l", f"{datadir}/server.log", "-o", options, "-w", "start"], check=True, stdout=subprocess.DEVNULL)
    try:
        yield f"postgresql+psycopg://rstar@/postgres?host={datadir}&port={PORT}"
    finally:
        subprocess.run([*as_postgres, f"{bindir}/pg_ctl", "-D", datadir, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(datadir, ignore_errors=True)


def test_migrations_and_round_trip_on_postgresql(postgres_url):
    sessions = open_database(postgres_url)
    open_database(postgres_url)  # idempotent on a second start
    engine = make_engine(postgres_url)
    assert engine.dialect.name == "postgresql"
    assert {current_revision(engine)} == set(ScriptDirectory(str(MIGRATIONS_DIR)).get_heads())
    assert {"conversations", "messages", "eval_runs", "eval_samples"} <= set(inspect(engine).get_table_names())
    with sessions() as session:
        conversation = Conversation(model="m", title="pg")
        conversation.messages = [Message(position=0, role="user", content="hi", extra={"k": [1, 2]})]
        run = EvalRun(model="m", suite=["aime24"], summary={"aime24": {"avg@1": 0.5}})
        session.add_all([conversation, run])
        session.flush()
        session.add(EvalSample(run_id=run.id, benchmark="aime24", doc_id="7", sample_index=0, score=1.0, grade={"answer": "25"}))
        session.commit()
    with sessions() as session:
        assert session.scalars(select(Message.extra)).one() == {"k": [1, 2]}
        assert session.scalars(select(EvalSample.grade)).one() == {"answer": "25"}


def test_the_api_stores_and_exports_trajectories_on_postgresql(postgres_url, make_server):
    """A chat answer that ran a cell in the real sandbox: its trajectory goes into PostgreSQL, the JSONL export
    reads it back as stored, and deleting the conversation takes its trajectories with it."""
    client, http, _, _ = make_server(replies=TOOL_TURNS, sandbox=LocalClient(), database_url=postgres_url)
    conversation_id = client.chat.completions.create(model="scripted", messages=QUESTION, logprobs=True).conversation_id
    exported = [json.loads(line) for line in http.get("/v1/conversations/export.jsonl").text.splitlines()]
    [record] = [line for line in exported if line["conversation_id"] == conversation_id]
    assert record["tool_calls"][0]["stdout"] == "42\n" and record["tool_calls"][0]["exec_status"] == "ok"  # the sandbox ran print(6*7)
    assert record["messages"] == QUESTION and record["stop_reason"] == "stop" and len(record["turns"]) == 2
    assert len(record["response_ids"]) == len(record["response_mask"]) == len(record["logprobs"]) and {0, 1} <= set(record["response_mask"])

    sessions = open_database(postgres_url)
    try:
        with sessions() as session:
            row = session.scalars(select(StoredTrajectory).where(StoredTrajectory.conversation_id == conversation_id)).one()
            assert (row.num_turns, row.num_tool_calls, row.stop_reason) == (2, 1, "stop")
            # Token ids, the mask and float logprobs come back from PostgreSQL's JSON as they went in.
            assert {key: row.trajectory[key] for key in ("prompt_ids", "response_ids", "response_mask", "logprobs")} == {
                key: record[key] for key in ("prompt_ids", "response_ids", "response_mask", "logprobs")
            }
        assert http.delete(f"/v1/conversations/{conversation_id}").json()["deleted"] is True
        with sessions() as session:
            assert session.scalars(select(StoredTrajectory).where(StoredTrajectory.conversation_id == conversation_id)).all() == []
    finally:
        close_database(sessions)
