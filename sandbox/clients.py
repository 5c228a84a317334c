"""One interface, three ways to reach a sandbox: in-process, over HTTP, or a Ray cluster.

The server's tool loop, evals and RL take a `SandboxClient` and do not care which one they got:

    async with connect(settings.sandbox) as sandbox:            # in-process pool
    async with connect(settings.sandbox, url="http://h:8088") as sandbox:
    async with connect(settings.sandbox, ray=True) as sandbox:  # one pool per Ray node
        result = await sandbox.run(RunRequest(code="print(1)"))
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import httpx

from .pool import SandboxPool
from .schemas import RunRequest, RunResult, VerifyResult, error_result
from .settings import SandboxSettings
from .verify import RewardRule


@runtime_checkable
class SandboxClient(Protocol):
    async def start(self) -> Any: ...
    async def run(self, request: RunRequest | dict) -> RunResult: ...
    async def run_batch(self, requests: list) -> list[RunResult]: ...
    async def verify(self, response: str, gold: str, timeout_s: float | None = None, rule: RewardRule = "boxed") -> VerifyResult: ...
    async def close_session(self, session_id: str) -> None: ...
    async def close_container(self, container_id: str) -> None: ...
    async def health(self) -> dict: ...
    async def close(self) -> None: ...


class _Context:
    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class LocalClient(_Context):
    """The pool in this process: no HTTP hop, the lowest latency."""

    def __init__(self, settings: SandboxSettings | None = None, pool: SandboxPool | None = None) -> None:
        self.pool = pool or SandboxPool(settings)

    async def start(self) -> "LocalClient":
        await self.pool.start()
        return self

    async def run(self, request: RunRequest | dict) -> RunResult:
        return await self.pool.run(request)

    async def run_batch(self, requests: list) -> list[RunResult]:
        return await self.pool.run_batch(requests)

    async def verify(self, response: str, gold: str, timeout_s: float | None = None, rule: RewardRule = "boxed") -> VerifyResult:
        return await self.pool.verify(response, gold, timeout_s, rule)

    async def close_session(self, session_id: str) -> None:
        await self.pool.close_session(session_id)

    async def close_container(self, container_id: str) -> None:
        await self.pool.close_session(container_id)  # the zygote keeps a container's interpreter as the session of its id

    async def health(self) -> dict:
        return self.pool.health()

    async def close(self) -> None:
        await self.pool.close()


class HttpClient(_Context):
    """A `rstar sandbox serve` elsewhere. Transport failures become internal_error results, not exceptions.

    Cancelling a call (its task) closes its connection, since httpx does not reuse a connection whose
    response was left unread; the service takes the disconnect as the order to kill the cell."""

    def __init__(self, url: str, timeout_s: float = 3600.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else None
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout_s, headers=headers)

    async def start(self) -> "HttpClient":
        return self

    async def _post(self, path: str, payload: Any) -> Any:
        response = await self._http.post(path, json=payload)
        return response.json()

    async def run(self, request: RunRequest | dict) -> RunResult:
        payload = request.model_dump(exclude_none=True) if isinstance(request, RunRequest) else request
        try:
            return RunResult.model_validate(await self._post("/run", payload))
        except (httpx.HTTPError, ValueError) as exc:
            return error_result("internal_error", f"sandbox service at {self.url} failed: {exc}")

    async def run_batch(self, requests: list) -> list[RunResult]:
        payload = [r.model_dump(exclude_none=True) if isinstance(r, RunRequest) else r for r in requests]
        try:
            body = await self._post("/run/batch", {"requests": payload})
            return [RunResult.model_validate(r) for r in body["results"]]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            return [error_result("internal_error", f"sandbox service at {self.url} failed: {exc}")] * len(requests)

    async def verify(self, response: str, gold: str, timeout_s: float | None = None, rule: RewardRule = "boxed") -> VerifyResult:
        try:
            body = await self._post("/verify", {"response": response, "gold": gold, "timeout_s": timeout_s, "rule": rule})
            return VerifyResult.model_validate(body)
        except (httpx.HTTPError, ValueError) as exc:
            return VerifyResult(correct=False, status="internal_error", detail=str(exc))

    async def close_session(self, session_id: str) -> None:
        await self._http.delete(f"/sessions/{session_id}")

    async def close_container(self, container_id: str) -> None:
        (await self._http.delete(f"/containers/{container_id}/session")).raise_for_status()

    async def health(self) -> dict:
        return (await self._http.get("/health")).json()

    async def close(self) -> None:
        await self._http.aclose()


def connect(settings: SandboxSettings | None = None, *, url: str | None = None, ray: bool = False) -> SandboxClient:
    """The client for a deployment: HTTP when given a URL, Ray when asked, else an in-process pool."""
    settings = settings or SandboxSettings()
    if url:
        return HttpClient(url, token=settings.token)
    if ray:
        from .ray_pool import RayPool

        return RayPool(settings)
    return LocalClient(settings)
