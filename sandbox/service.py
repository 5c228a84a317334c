"""HTTP service: thin FastAPI routes over one SandboxPool.

`/run` and `/run/batch` speak two dialects, told apart by their fields: ours (`code`, `tool`, ...) and
rStar2-Agent's code-judge (`solution`, `type`; batches as `{"type": "batch", "submissions": [...]}`), so
rStar2-Agent's verl tools and scripts can point here unchanged. `/run/long-batch` is code-judge's batch
with a long queue wait. Bad input of any kind gets a result with status `invalid_input` (HTTP 400 only when
the body is not JSON at all); nothing a client sends can take the service down.

What a caller is allowed: with `token` set, every route but /health needs `Authorization: Bearer <token>`.
Bodies must be `application/json` (a cross-site form or `text/plain` POST runs nothing) and are cut off at
MAX_BODY_BYTES while they are read; a batch holds at most `max_batch` requests. Session ids are scoped to
their creator (its address and credential), so no other client can run in a session or close it. A
container's interpreter is named by the container's id alone, in `/run` and `DELETE /containers/{id}/session`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import uuid
from collections.abc import Awaitable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from rstar.asgi import ClientDisconnected, cancel_on_disconnect

from .pool import SandboxPool
from .schemas import (CONTAINER_ID, BatchResult, CodeJudgeBatch, CodeJudgeBatchResult, CodeJudgeSubmission, RunResult,
                      VerifyRequest, error_result, is_code_judge, request_from_submission, to_code_judge)
from .settings import SandboxSettings

log = logging.getLogger("rstar.sandbox")
MAX_BODY_BYTES = 64 * 1024 * 1024


class BadBody(Exception):
    def __init__(self, message: str, status_code: int = 400):
        super().__init__(message)
        self.status_code = status_code


async def _json_body(request: Request) -> Any:
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise BadBody(f"the body must be application/json, not {media_type or 'untyped'}", 415)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BadBody(f"request body of {declared} bytes exceeds {MAX_BODY_BYTES}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():  # counted as it arrives: a chunked body cannot grow past the cap
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadBody(f"request body exceeds {MAX_BODY_BYTES} bytes", 413)
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # deep nesting overflows the parser
        raise BadBody(f"request body is not valid JSON: {type(exc).__name__}: {exc}") from exc


def _owner(request: Request) -> str:
    """Who a session belongs to: the caller's address and the credential it sent."""
    client = request.client.host if request.client else ""
    return hashlib.sha256(f"{client}\0{request.headers.get('authorization', '')}".encode()).hexdigest()[:16]


def _scoped(item: Any, owner: str) -> Any:
    """A request whose session id is its owner's own (other fields and shapes as they are)."""
    if isinstance(item, dict) and isinstance(item.get("session_id"), str):
        return {**item, "session_id": f"{owner}/{item['session_id']}"}
    return item


def _invalid(message: str, status_code: int = 400) -> JSONResponse:
    return JSONResponse(error_result("invalid_input", message).model_dump(), status_code=status_code)


async def _unless_client_leaves(request: Request, work: Awaitable[Any]) -> Any:
    """Cancelling the pool's call when the client leaves is what has the zygote kill the cell, instead of
    letting it run to its deadline on a worker nobody waits for."""
    try:
        return await cancel_on_disconnect(request.receive, work)
    except ClientDisconnected:
        return Response(status_code=499)  # nobody reads it: the client is gone


def create_app(settings: SandboxSettings | None = None, pool: SandboxPool | None = None) -> FastAPI:
    """The service; it owns `pool` (started on startup, closed on shutdown)."""
    pool = pool or SandboxPool(settings or SandboxSettings())

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await pool.start()
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="rstar sandbox", lifespan=lifespan)
    app.state.pool = pool
    token = pool.settings.token

    @app.middleware("http")
    async def require_token(request: Request, call_next):
        if token is not None and request.url.path != "/health":
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
                return _invalid("missing or wrong sandbox token: send `Authorization: Bearer <token>`", 401)
        return await call_next(request)

    @app.exception_handler(BadBody)
    async def bad_body(_: Request, exc: BadBody) -> JSONResponse:
        return _invalid(str(exc), exc.status_code)

    def too_many(count: int) -> JSONResponse | None:
        limit = pool.settings.max_batch
        return _invalid(f"a batch of {count} requests exceeds max_batch ({limit})", 413) if count > limit else None

    async def run_code_judge(sub_obj: Any, queue_timeout_s: float | None = None) -> dict:
        try:
            sub = CodeJudgeSubmission.model_validate(sub_obj)
        except Exception as exc:  # noqa: BLE001 - any malformed submission is the client's input error
            return to_code_judge(error_result("invalid_input", f"invalid submission: {exc}")).model_dump()
        request = request_from_submission(sub)
        result = request if isinstance(request, RunResult) else await pool.run(request, queue_timeout_s)
        return to_code_judge(result, sub.sub_id, sub.expected_output).model_dump()

    @app.post("/run")
    async def run(request: Request) -> Any:
        body = _scoped(await _json_body(request), _owner(request))

        async def answer() -> Any:
            if is_code_judge(body):
                return await run_code_judge(body)
            return (await pool.run(body)).model_dump()

        return await _unless_client_leaves(request, answer())

    async def batch(body: Any, owner: str, queue_timeout_s: float | None) -> Any:
        if is_code_judge(body) or (isinstance(body, dict) and body.get("type") == "batch"):
            submissions = body.get("submissions")
            if isinstance(submissions, list) and (refused := too_many(len(submissions))):
                return refused
            try:
                cj = CodeJudgeBatch.model_validate(body)
            except Exception as exc:  # noqa: BLE001
                return _invalid(f"invalid batch: {exc}", 422)
            results = await asyncio.gather(*(run_code_judge(s, queue_timeout_s) for s in cj.submissions))
            return CodeJudgeBatchResult(sub_id=cj.sub_id or str(uuid.uuid4()), results=results).model_dump()
        items = body.get("requests") if isinstance(body, dict) else body
        if not isinstance(items, list):
            return _invalid("a batch is a JSON list of requests, or {\"requests\": [...]}", 422)
        if refused := too_many(len(items)):
            return refused
        return BatchResult(results=await pool.run_batch([_scoped(item, owner) for item in items], queue_timeout_s)).model_dump()

    @app.post("/run/batch")
    async def run_batch(request: Request) -> Any:
        body = await _json_body(request)
        return await _unless_client_leaves(request, batch(body, _owner(request), None))

    @app.post("/run/long-batch")
    async def run_long_batch(request: Request) -> Any:
        body = await _json_body(request)
        return await _unless_client_leaves(request, batch(body, _owner(request), pool.settings.long_batch_queue_timeout_s))

    @app.post("/verify")
    async def verify(request: Request) -> Any:
        body = await _json_body(request)
        try:
            req = VerifyRequest.model_validate(body)
        except Exception as exc:  # noqa: BLE001
            return _invalid(f"invalid verify request: {exc}", 422)

        async def answer() -> Any:
            return (await pool.verify(req.response, req.gold, req.timeout_s, req.rule)).model_dump()

        return await _unless_client_leaves(request, answer())

    @app.delete("/sessions/{session_id}")
    async def close_session(session_id: str, request: Request) -> dict:
        await pool.close_session(_scoped({"session_id": session_id}, _owner(request))["session_id"])
        return {"closed": session_id}

    @app.delete("/containers/{container_id}/session")
    async def close_container(container_id: str) -> Any:
        """End a container's interpreter (the API deleted it or it expired). Unlike session ids, a container id
        is not scoped to its caller: it is the container's one name in /run too, and unguessable."""
        if not re.fullmatch(CONTAINER_ID, container_id):
            return _invalid(f"{container_id!r} is not a container id")
        await pool.close_session(container_id)
        return {"closed": container_id}

    @app.get("/health")
    async def health() -> JSONResponse:
        report = pool.health()
        return JSONResponse(report, status_code=200 if report["status"] == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(pool.render_metrics(), media_type="text/plain; version=0.0.4")

    return app
