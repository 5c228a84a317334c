"""Run bookkeeping in the database: runs, per-step metrics, checkpoints, cancellation.

Everything here is plain SQLAlchemy on the server's schema (`rstar.server.db`, migration 0004), so the CLI,
the training process and the API server read and write the same rows: `rstar rl stop` in one shell stops a
run another process executes, and `GET /v1/rl/runs/{id}` shows a CLI run's curves.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import sessionmaker

from rstar.orphan_guard import pid_alive
from rstar.server.db import RlCheckpoint, RlRun, RlStep

TERMINAL = ("finished", "failed", "cancelled")


class RunConflict(RuntimeError):
    """Another run is in progress where only one may be (one per server), or this one already is."""


class UnknownRun(LookupError):
    pass


def _now() -> datetime:
    return datetime.now(timezone.utc)


def new_run_id(kind: str) -> str:
    return f"{kind}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"


def process_alive(host: str, pid: int | None) -> bool:
    """Whether a run's process still exists (only knowable for this host; another host's run counts as alive)."""
    if pid is None:
        return False
    return host != socket.gethostname() or pid_alive(pid)


def run_view(run: RlRun, steps: list[RlStep] | None = None) -> dict[str, Any]:
    """A run as the CLI and the API show it. A run left `running` whose process is gone reads `interrupted`."""
    status = run.status
    if status == "running" and not process_alive(run.host, run.pid):
        status = "interrupted"
    view = {
        "id": run.id,
        "object": "rl.run",
        "kind": run.kind,
        "status": status,
        "model": run.model,
        "data": run.data,
        "recipe": run.recipe,
        "run_dir": run.run_dir,
        "step": run.step,
        "total_steps": run.total_steps,
        "cancel_requested": run.cancel_requested,
        "error": run.error,
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "checkpoints": [{"step": c.step, "path": c.path} for c in run.checkpoints if not c.removed],
    }
    if steps is not None:
        view["steps"] = [{"step": s.step, "stage": s.stage, "created_at": s.created_at.isoformat(), **s.metrics} for s in steps]
    return view


class RunStore:
    def __init__(self, sessions: sessionmaker):
        self.sessions = sessions

    def begin(self, run_id: str, kind: str, model: str, recipe: dict, data: str, run_dir: str, total_steps: int) -> bool:
        """Register this process as the run's executor; True when it resumes an existing run.

        A run already executing elsewhere (its process alive) is a RunConflict; a finished one cannot be resumed.
        """
        with self.sessions.begin() as session:
            run = session.get(RlRun, run_id)
            if run is None:
                session.add(RlRun(id=run_id, kind=kind, model=model, recipe=recipe, data=data, run_dir=run_dir, total_steps=total_steps,
                                  host=socket.gethostname(), pid=os.getpid(), status="running"))
                return False
            if run.kind != kind:
                raise RunConflict(f"run {run_id} is a {run.kind} run, not {kind}")
            if run.status == "running" and process_alive(run.host, run.pid) and run.pid != os.getpid():
                raise RunConflict(f"run {run_id} is already running (pid {run.pid} on {run.host}); stop it with `rstar rl stop {run_id}`")
            if run.status == "finished":
                raise RunConflict(f"run {run_id} already finished all {run.total_steps} steps; start a new run id")
            run.status, run.host, run.pid, run.error, run.finished_at = "running", socket.gethostname(), os.getpid(), None, None
            run.cancel_requested, run.updated_at = False, _now()
            return True

    def running(self) -> dict | None:
        """The run in progress whose process is alive, if any."""
        with self.sessions() as session:
            for run in session.scalars(select(RlRun).where(RlRun.status == "running")):
                if process_alive(run.host, run.pid):
                    return run_view(run)
        return None

    def record_step(self, run_id: str, step: int, stage: str, metrics: dict) -> None:
        with self.sessions.begin() as session:
            session.execute(delete(RlStep).where(RlStep.run_id == run_id, RlStep.step == step))
            session.add(RlStep(run_id=run_id, step=step, stage=stage, metrics=metrics))
            run = session.get(RlRun, run_id)
            run.step, run.updated_at = step, _now()

    def forget_steps_after(self, run_id: str, step: int) -> int:
        """Drop metrics of steps after a checkpoint (a resumed run redoes them); returns how many."""
        with self.sessions.begin() as session:
            result = session.execute(delete(RlStep).where(RlStep.run_id == run_id, RlStep.step > step))
            session.get(RlRun, run_id).step = step
            return result.rowcount

    def record_checkpoint(self, run_id: str, step: int, path: str, removed_paths: list[str]) -> None:
        with self.sessions.begin() as session:
            session.execute(delete(RlCheckpoint).where(RlCheckpoint.run_id == run_id, RlCheckpoint.step == step))
            session.add(RlCheckpoint(run_id=run_id, step=step, path=path))
            for checkpoint in session.scalars(select(RlCheckpoint).where(RlCheckpoint.run_id == run_id, RlCheckpoint.path.in_(removed_paths))):
                checkpoint.removed = True

    def finish(self, run_id: str, status: str, error: str | None = None) -> None:
        with self.sessions.begin() as session:
            run = session.get(RlRun, run_id)
            run.status, run.error, run.finished_at, run.updated_at = status, error, _now(), _now()

    @contextmanager
    def failed_on_error(self, run_id: str) -> Iterator[None]:
        """Marks the run failed, with the error, when the body raises. An interrupt (Ctrl-C, SIGTERM, a
        cancelled task) is not a failure: the run stays "running" on record and resumable from its checkpoint."""
        try:
            yield
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self.finish(run_id, "failed", f"{type(exc).__name__}: {exc}")
            raise

    def request_cancel(self, run_id: str) -> dict:
        with self.sessions.begin() as session:
            run = session.get(RlRun, run_id)
            if run is None:
                raise UnknownRun(run_id)
            if run.status == "running":
                run.cancel_requested, run.updated_at = True, _now()
                if not process_alive(run.host, run.pid):  # nobody to read the flag: it is stopped now
                    run.status, run.finished_at = "cancelled", _now()
            return run_view(run)

    def cancel_requested(self, run_id: str) -> bool:
        with self.sessions() as session:
            run = session.get(RlRun, run_id)
            return bool(run and run.cancel_requested)

    def get(self, run_id: str, with_steps: bool = True) -> dict:
        with self.sessions() as session:
            run = session.get(RlRun, run_id)
            if run is None:
                raise UnknownRun(run_id)
            return run_view(run, list(run.steps) if with_steps else None)

    def list(self, limit: int = 50) -> list[dict]:
        with self.sessions() as session:
            runs = session.scalars(select(RlRun).order_by(RlRun.created_at.desc()).limit(limit))
            return [run_view(run) for run in runs]
