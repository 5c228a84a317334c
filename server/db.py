"""Persistence: SQLAlchemy 2.x models, the engine and session factory, and schema migrations (Alembic).

The one persistence layer for every feature: conversations and trajectories (server/conversations.py), eval
runs and samples (written by evals/runner.py's RunStore, read by server/routes_evals.py) and RL runs
(rl/runs.py). Each feature keeps its queries beside it; this module owns the tables and how a process
reaches them.

SQLite in the user data dir by default; PostgreSQL by URL. The schema is only ever changed by the
migrations in `migrations/versions`, which `open_database` applies on start-up.

A process opens its database once (`open_database`) and hands the session factory to everything that
needs it: the API app keeps it in `app.state.database` for its routes (`app_database`), a CLI command
holds it for the command's length. One engine per URL per process: one connection pool to size and to
close at shutdown, and no route opening (and migrating) a database of its own behind the app's back.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from uuid import uuid4

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint, create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship, sessionmaker
from starlette.requests import Request

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class Conversation(Base):
    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: uuid4().hex)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=_now, index=True)  # its latest exchange
    # A digest of the API key that stored it (server/auth.py key_owner); None: stored without a key, or before
    # conversations had owners.
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    model: Mapped[str] = mapped_column(String(256))
    title: Mapped[str] = mapped_column(String(256), default="")
    messages: Mapped[list[Message]] = relationship(back_populates="conversation", order_by="Message.position", cascade="all, delete-orphan")
    trajectories: Mapped[list[StoredTrajectory]] = relationship(back_populates="conversation", cascade="all, delete-orphan", passive_deletes=True)


class Message(Base):
    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text, default="")
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # reasoning, tool calls, finish reason, usage
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    conversation: Mapped[Conversation] = relationship(back_populates="messages")


class StoredTrajectory(Base):
    """One choice's agent-loop trajectory (server/trajectory.py's Trajectory.to_dict()) and the messages it
    answered: what `GET /v1/conversations/export.jsonl` writes for SFT/RL data."""

    __tablename__ = "trajectories"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    choice: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    model: Mapped[str] = mapped_column(String(256))
    messages: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    trajectory: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    stop_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    num_turns: Mapped[int] = mapped_column(Integer, default=0)
    num_tool_calls: Mapped[int] = mapped_column(Integer, default=0)
    conversation: Mapped[Conversation] = relationship(back_populates="trajectories")


class EvalRun(Base):
    """One `rstar eval run`: what was asked, where it stands, and its scores once graded."""

    __tablename__ = "eval_runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: uuid4().hex)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="running")  # running | finished | failed | interrupted
    model: Mapped[str] = mapped_column(String(256))
    endpoint: Mapped[str] = mapped_column(String(512), default="")  # empty: in-process engine
    suite: Mapped[list[str]] = mapped_column(JSON, default=list)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # sampling and limits per benchmark
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # scores per benchmark, with standard errors
    run_dir: Mapped[str] = mapped_column(String(1024), default="")  # reports and plots
    samples: Mapped[list[EvalSample]] = relationship(back_populates="run", cascade="all, delete-orphan")


class EvalSample(Base):
    """One graded sample; the unique key is what makes a resumed run skip, never double-count, a sample."""

    __tablename__ = "eval_samples"
    __table_args__ = (UniqueConstraint("run_id", "benchmark", "doc_id", "sample_index", name="uq_eval_sample"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("eval_runs.id", ondelete="CASCADE"), index=True)
    benchmark: Mapped[str] = mapped_column(String(64))
    doc_id: Mapped[str] = mapped_column(String(256))
    sample_index: Mapped[int] = mapped_column(Integer)
    score: Mapped[float] = mapped_column(Float)
    grade: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # grader details (extracted answer, permutation, ...)
    request: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    response: Mapped[Any] = mapped_column(JSON, default=None)  # text, or tool calls for BFCL
    trajectory: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    num_turns: Mapped[int] = mapped_column(Integer, default=0)
    num_tool_calls: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    run: Mapped[EvalRun] = relationship(back_populates="samples")


class RlRun(Base):
    """One `rstar rl train` (GRPO-RoC) or `rstar rl sft` run: what was asked, where it stands.

    `pid` and `host` name the process doing the work: a run left `running` whose process is gone was killed,
    and the same command resumes it from its last checkpoint. Cancelling sets `cancel_requested`, which the
    run reads between steps, so the CLI and the API can stop a run that another process executes.
    """

    __tablename__ = "rl_runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # grpo | sft
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="running")  # running | finished | failed | cancelled
    model: Mapped[str] = mapped_column(String(1024))
    recipe: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # the validated recipe (or SFT config)
    data: Mapped[str] = mapped_column(String(1024))
    run_dir: Mapped[str] = mapped_column(String(1024))
    step: Mapped[int] = mapped_column(Integer, default=0)  # steps completed
    total_steps: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    host: Mapped[str] = mapped_column(String(256), default="")
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    steps: Mapped[list[RlStep]] = relationship(back_populates="run", cascade="all, delete-orphan", order_by="RlStep.step")
    checkpoints: Mapped[list[RlCheckpoint]] = relationship(back_populates="run", cascade="all, delete-orphan", order_by="RlCheckpoint.step")


class RlStep(Base):
    """One finished step's metrics; the unique key makes a resumed run overwrite, never double-count, a step."""

    __tablename__ = "rl_steps"
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_rl_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("rl_runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)  # 1-based: the step's number once finished
    stage: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    run: Mapped[RlRun] = relationship(back_populates="steps")


class RlCheckpoint(Base):
    __tablename__ = "rl_checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_rl_checkpoint"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("rl_runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    removed: Mapped[bool] = mapped_column(Boolean, default=False)  # pruned from disk (keep_checkpoints)
    run: Mapped[RlRun] = relationship(back_populates="checkpoints")


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    # WAL lets readers (the UI, `rstar eval show`) work while the server writes; foreign keys are off by default.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def _alembic_config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Bring the schema to `revision` with Alembic, on this engine's connection."""
    from alembic import command

    config = _alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Take the schema back to `revision` (for rolling back a deployment; data in dropped tables is lost)."""
    from alembic import command

    config = _alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def open_database(url: str) -> sessionmaker:
    """Engine + migrated schema + a session factory. Call it once per process and URL, and share the result."""
    engine = make_engine(url)
    upgrade(engine)
    return sessionmaker(engine, expire_on_commit=False)


def close_database(sessions: sessionmaker) -> None:
    """Release the pooled connections of the engine behind `sessions` (at shutdown)."""
    with sessions() as session:
        session.get_bind().dispose()


def app_database(request: Request) -> sessionmaker:
    """The session factory the API app opened at start-up (`app.state.database`): a route dependency, so
    every route of the app shares its one engine."""
    return request.app.state.database
