"""OpenAI-shaped errors: every failure leaves the server as `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from rstar.server.engine import EngineFailed
from rstar.server.schemas import ErrorInfo, ErrorResponse

log = logging.getLogger("rstar.server")

# HTTP status -> the `type` OpenAI's SDK maps to its exception classes.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    421: "invalid_request_error",
    413: "invalid_request_error",
    504: "timeout",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers


@contextlib.contextmanager
def naming_field(field: str) -> Iterator[None]:
    """Refusals raised inside name `field` instead: the request's field the refused thing came from."""
    try:
        yield
    except APIError as refused:
        raise APIError(refused.status, refused.message, field, refused.code, refused.headers) from None


def error_body(status: int, message: str, param: str | None = None, code: str | int | None = None) -> dict:
    info = ErrorInfo(message=message, type=_ERROR_TYPES.get(status, "server_error"), param=param, code=code if code is not None else status)
    return ErrorResponse(error=info).model_dump()


def error_response(status: int, message: str, param: str | None = None, code: str | int | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = list(first.get("loc", ()))
        if loc and loc[0] in ("body", "query", "path"):  # named as the client wrote it: `messages.0.role`, `limit`
            loc = loc[1:]
        param = ".".join(map(str, loc)) or None
        return error_response(400, f"{param or 'request'}: {first['msg']}", param)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(EngineFailed)
    async def _engine_failed(_: Request, exc: EngineFailed):  # the server's state, not the request's fault
        return error_response(503, f"engine unavailable: {exc}", code="engine_unavailable")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(exc).__name__}")
