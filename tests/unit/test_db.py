"""Schema migrations and the models on a real SQLite file (PostgreSQL in test_db_postgres)."""

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError

from rstar.server.db import MIGRATIONS_DIR, Conversation, EvalRun, EvalSample, Message, current_revision, downgrade, make_engine, open_database, upgrade


def test_migrations_create_every_table_and_are_idempotent(tmp_path):
    url = f"sqlite:///{tmp_path}/nested/dir/rstar.db"
    open_database(url)
    open_database(url)  # a second start applies nothing and breaks nothing
    engine = make_engine(url)
    assert set(inspect(engine).get_table_names()) >= {"alembic_version", "conversations", "messages", "eval_runs", "eval_samples"}
    assert {current_revision(engine)} == set(ScriptDirectory(str(MIGRATIONS_DIR)).get_heads())


def test_downgrade_and_upgrade_again(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/rstar.db")
    upgrade(engine)
    downgrade(engine, "0001")
    assert current_revision(engine) == "0001"
    assert "eval_runs" not in inspect(engine).get_table_names()
    upgrade(engine)
    assert "eval_runs" in inspect(engine).get_table_names()


def test_conversation_round_trip_keeps_message_order_and_extras(tmp_path):
    sessions = open_database(f"sqlite:///{tmp_path}/rstar.db")
    with sessions() as session:
        conversation = Conversation(model="m", title="t")
        conversation.messages = [
            Message(position=1, role="assistant", content="4", extra={"reasoning": "2+2"}),
            Message(position=0, role="user", content="2+2?"),
        ]
        session.add(conversation)
        session.commit()
        conversation_id = conversation.id
    with sessions() as session:
        loaded = session.get(Conversation, conversation_id)
        assert [(m.role, m.content, m.extra) for m in loaded.messages] == [("user", "2+2?", {}), ("assistant", "4", {"reasoning": "2+2"})]


def test_eval_sample_is_unique_per_run_doc_and_index(tmp_path):
    sessions = open_database(f"sqlite:///{tmp_path}/rstar.db")
    with sessions() as session:
        run = EvalRun(model="m", suite=["aime24"])
        session.add(run)
        session.flush()
        session.add(EvalSample(run_id=run.id, benchmark="aime24", doc_id="1", sample_index=0, score=1.0))
        session.commit()
        session.add(EvalSample(run_id=run.id, benchmark="aime24", doc_id="1", sample_index=0, score=0.0))
        with pytest.raises(IntegrityError):
            session.commit()
        session.rollback()
        assert session.scalars(select(EvalSample.score)).all() == [1.0]
