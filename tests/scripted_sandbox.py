"""A SandboxClient that answers from a script instead of running code: the unit-test stand-in for the
sandbox. It records every request and which runs were cancelled, so tests can check both sides."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from rstar.sandbox.schemas import RunRequest, RunResult


@dataclass
class ScriptedSandbox:
    outputs: dict[str, str] = field(default_factory=dict)  # code -> stdout; other code prints nothing
    delay_s: float = 0.0  # > 0 keeps runs in flight long enough to cancel
    requests: list[RunRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)  # code of runs cancelled mid-way
    status: str = "ok"
    started: bool = False
    closed: bool = False

    async def start(self) -> "ScriptedSandbox":
        self.started = True
        return self

    async def run(self, request: RunRequest | dict) -> RunResult:
        request = request if isinstance(request, RunRequest) else RunRequest.model_validate(request)
        self.requests.append(request)
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled.append(request.code)
            raise
        if self.status != "ok":
            return RunResult(status=self.status, stderr=f"scripted {self.status}", duration_s=0.01)
        return RunResult(status="ok", exit_code=0, stdout=self.outputs.get(request.code, ""), duration_s=0.01)

    async def run_batch(self, requests: list) -> list[RunResult]:
        return [await self.run(r) for r in requests]

    async def verify(self, response: str, gold: str, timeout_s: float | None = None):
        raise NotImplementedError

    async def close_session(self, session_id: str) -> None:
        pass

    async def health(self) -> dict:
        return {"status": "ok" if self.started and not self.closed else "closed", "scripted": True}

    async def close(self) -> None:
        self.closed = True
