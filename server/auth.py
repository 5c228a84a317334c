"""Who may call the server: the API key on /v1 and the tokenizer routes, the admin key on what changes the
server or reads every client's data, and, without any key, only requests addressed to a loopback name.

The key checks are route dependencies (`API_KEY`, `ADMIN_KEY`) that read the app's settings
(`app.state.settings`, set where the app is built), so a router module needs no settings of its own.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from rstar.config import Settings
from rstar.network import host_name, is_loopback
from rstar.server.errors import APIError, error_body


def serve_refusal(settings: Settings) -> str | None:
    """Why `rstar serve` must not start with these settings, or None."""
    if settings.api_key is None and not is_loopback(settings.host) and not settings.insecure_no_auth:
        return (
            f"refusing to serve on {settings.host} without an API key: anyone who reaches it could chat, read the stored conversations "
            "and run code. Set RSTAR_API_KEY (or --api-key), listen on 127.0.0.1, or pass --insecure-no-auth to mean it."
        )
    if settings.enable_rl and settings.api_key is not None and settings.admin_key is None:
        return "--enable-rl on a server with an API key needs an admin key (RSTAR_ADMIN_KEY or --admin-key): RL retrains the model every client is served."
    return None


def _check_bearer(request: Request, key: str | None, which: str) -> None:
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # Constant-time comparison: the server may face the internet.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
        raise APIError(401, f"Incorrect or missing {which}: send `Authorization: Bearer <key>`.", code=f"invalid_{which.lower().replace(' ', '_')}")


async def require_api_key(request: Request) -> None:
    """`Authorization: Bearer <key>` when the server has an API key."""
    _check_bearer(request, request.app.state.settings.api_key, "API key")


async def require_admin_key(request: Request) -> None:
    """For what changes the server or reads every client's data (RL runs, the conversation list and export):
    the admin key where there is one, else the API key."""
    settings: Settings = request.app.state.settings
    if settings.admin_key is None:
        return await require_api_key(request)
    _check_bearer(request, settings.admin_key, "admin key")


API_KEY = [Depends(require_api_key)]
ADMIN_KEY = [Depends(require_admin_key)]


def key_owner(request: Request) -> str | None:
    """Whose conversations a request let in by `API_KEY` stores and reads by id: a digest of the key (the
    database never holds the key itself), or None on a server without one. Another key finds none of them."""
    key = request.app.state.settings.api_key
    return None if key is None else hashlib.sha256(key.encode()).hexdigest()


class LoopbackHostOnly:
    """ASGI middleware for a server without a key: a request whose Host header is not a loopback name gets a
    421. A web page the operator opens cannot reach 127.0.0.1 by DNS rebinding then, since its requests carry
    the page's own host name."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not is_loopback(host_name(host)):
                message = f"Host {host!r} is not a loopback name: a server without an API key answers only requests addressed to localhost"
                return await JSONResponse(error_body(421, message, "host", "misdirected_request"), status_code=421)(scope, receive, send)
        await self.app(scope, receive, send)
