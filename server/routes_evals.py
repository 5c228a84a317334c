"""Read-only eval-run endpoints over the EvalRun / EvalSample tables (the UI's Evaluations tab reads these).

The eval runner writes runs and samples; nothing here changes them. The routes read through the session
factory the app opened at start-up (`app_database`), the same engine its other routes use. Files are served
only from a run's own directory, by plain file name, so a request can never name a path outside it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import FileResponse
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from rstar.server.db import EvalRun, EvalSample, app_database
from rstar.server.errors import APIError
from rstar.server.schemas import CodeCell
from rstar.server.trajectory import ToolCallRecord

# The files a run directory holds for readers: reports and plots (the runner's report.json, report.md, *.png).
_SERVABLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\.(json|md|png)$")
_MEDIA_TYPES = {"json": "application/json", "md": "text/markdown; charset=utf-8", "png": "image/png"}


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def _run_row(run: EvalRun) -> dict[str, Any]:
    return {
        "id": run.id,
        "object": "eval.run",
        "created_at": _iso(run.created_at),
        "finished_at": _iso(run.finished_at),
        "status": run.status,
        "model": run.model,
        "endpoint": run.endpoint,
        "suite": run.suite,
        "summary": run.summary,
    }


def _sample_row(sample: EvalSample) -> dict[str, Any]:
    return {
        "id": sample.id,
        "object": "eval.sample",
        "run_id": sample.run_id,
        "benchmark": sample.benchmark,
        "doc_id": sample.doc_id,
        "sample_index": sample.sample_index,
        "score": sample.score,
        "num_turns": sample.num_turns,
        "num_tool_calls": sample.num_tool_calls,
        "prompt_tokens": sample.prompt_tokens,
        "completion_tokens": sample.completion_tokens,
        "created_at": _iso(sample.created_at),
    }


def _servable_files(run_dir: str) -> list[str]:
    directory = Path(run_dir) if run_dir else None
    if directory is None or not directory.is_dir():
        return []
    return sorted(path.name for path in directory.iterdir() if path.is_file() and not path.is_symlink() and _SERVABLE.match(path.name))


def _code_cells(trajectory: dict | None) -> list[dict[str, Any]]:
    """A stored trajectory's code cells as a chat answer shows them, so clients draw both alike."""
    records = [ToolCallRecord.of_stored(call) for call in (trajectory or {}).get("tool_calls") or []]
    return [cell.model_dump() for cell in map(CodeCell.of_record, records) if cell is not None]


def _get_run(session, run_id: str) -> EvalRun:
    run = session.get(EvalRun, run_id)
    if run is None:
        raise APIError(404, f"No eval run `{run_id}`.", "run_id", "not_found")
    return run


router = APIRouter(prefix="/v1/evals")
database = Depends(app_database)


@router.get("/runs")
def list_runs(sessions: sessionmaker = database, limit: int = Query(50, ge=1, le=500), offset: int = Query(0, ge=0)) -> dict[str, Any]:
    with sessions() as session:
        runs = session.scalars(select(EvalRun).order_by(EvalRun.created_at.desc()).limit(limit).offset(offset)).all()
        total = session.scalar(select(func.count()).select_from(EvalRun))
        return {"object": "list", "data": [_run_row(run) for run in runs], "total": total}


@router.get("/runs/{run_id}")
def get_run(run_id: str, sessions: sessionmaker = database) -> dict[str, Any]:
    with sessions() as session:
        run = _get_run(session, run_id)
        counts = session.execute(
            select(EvalSample.benchmark, func.count(), func.avg(EvalSample.score)).where(EvalSample.run_id == run_id).group_by(EvalSample.benchmark)
        ).all()
        return {
            **_run_row(run),
            "config": run.config,
            "run_dir": run.run_dir,
            "files": _servable_files(run.run_dir),
            # What is graded so far, per benchmark: a running run has samples before it has a summary.
            "samples": {benchmark: {"count": count, "mean_score": mean} for benchmark, count, mean in counts},
        }


@router.get("/runs/{run_id}/samples")
def list_samples(
    run_id: str,
    sessions: sessionmaker = database,
    benchmark: str | None = None,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0),
) -> dict[str, Any]:
    with sessions() as session:
        _get_run(session, run_id)
        query = select(EvalSample).where(EvalSample.run_id == run_id)
        if benchmark:
            query = query.where(EvalSample.benchmark == benchmark)
        total = session.scalar(select(func.count()).select_from(query.subquery()))
        order = (EvalSample.benchmark, EvalSample.doc_id, EvalSample.sample_index)
        samples = session.scalars(query.order_by(*order).limit(limit).offset(offset)).all()
        return {"object": "list", "data": [_sample_row(sample) for sample in samples], "total": total}


@router.get("/runs/{run_id}/samples/{sample_id}")
def get_sample(run_id: str, sample_id: int, sessions: sessionmaker = database) -> dict[str, Any]:
    with sessions() as session:
        sample = session.get(EvalSample, sample_id)
        if sample is None or sample.run_id != run_id:
            raise APIError(404, f"No sample {sample_id} in eval run `{run_id}`.", "sample_id", "not_found")
        return {**_sample_row(sample), "grade": sample.grade, "request": sample.request, "response": sample.response, "trajectory": sample.trajectory,
                "code_cells": _code_cells(sample.trajectory)}  # fmt: skip


@router.get("/runs/{run_id}/files/{name}")
def get_file(run_id: str, name: str, sessions: sessionmaker = database) -> FileResponse:
    with sessions() as session:
        run_dir = _get_run(session, run_id).run_dir
    # Only regular files listed from the directory itself are served: no separators, no "..", no symlinks out.
    if not _SERVABLE.match(name) or name not in _servable_files(run_dir):
        raise APIError(404, f"No file `{name}` in eval run `{run_id}`.", "name", "not_found")
    return FileResponse(Path(run_dir) / name, media_type=_MEDIA_TYPES[name.rsplit(".", 1)[1]])
