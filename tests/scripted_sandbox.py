"""A SandboxClient that answers from a script instead of running code: the unit-test stand-in for the
sandbox, and the only one. Tests hand it to the server as a client, or to the agent loop through the real
`SandboxExecutor` (`executor()`), so the request a call becomes is the one production sends. It records
every request and which runs were cancelled, so tests can check both sides."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from rstar.sandbox.schemas import CellImage, RunRequest, RunResult
from rstar.server.builtin_tools import SandboxExecutor


@dataclass
class ScriptedSandbox:
    outputs: dict[str, str] = field(default_factory=dict)  # code -> stdout
    images: dict[str, list[CellImage]] = field(default_factory=dict)  # code -> the figures its run returns
    stdout: str = ""  # what code not in `outputs` prints
    duration_s: float = 0.01  # the execution time each result reports
    delay_s: float = 0.0  # > 0 keeps runs in flight long enough to cancel
    status: str = "ok"  # another status fails every run with it
    error: Exception | None = None  # raised by every run: the sandbox itself is unreachable or broken
    requests: list[RunRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)  # code of runs cancelled mid-way
    closed_containers: list[str] = field(default_factory=list)  # ids whose interpreter the server stopped
    running: int = 0
    most_running: int = 0  # the most runs in flight at once
    started: bool = False
    closed: bool = False

    def executor(self) -> SandboxExecutor:
        return SandboxExecutor(self)

    @property
    def codes(self) -> list[str]:
        return [request.code for request in self.requests]

    async def start(self) -> "ScriptedSandbox":
        self.started = True
        return self

    async def run(self, request: RunRequest | dict) -> RunResult:
        request = request if isinstance(request, RunRequest) else RunRequest.model_validate(request)
        self.requests.append(request)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled.append(request.code)
            raise
        finally:
            self.running -= 1
        if self.error is not None:
            raise self.error
        if self.status != "ok":
            return RunResult(status=self.status, stderr=f"scripted {self.status}", duration_s=self.duration_s)
        stdout = self.outputs.get(request.code, self.stdout)
        return RunResult(status="ok", exit_code=0, stdout=stdout, duration_s=self.duration_s, images=self.images.get(request.code, []))

    async def run_batch(self, requests: list) -> list[RunResult]:
        return [await self.run(r) for r in requests]

    async def verify(self, response: str, gold: str, timeout_s: float | None = None, rule: str = "boxed"):
        raise NotImplementedError

    async def close_session(self, session_id: str) -> None:
        pass

    async def close_container(self, container_id: str) -> None:
        self.closed_containers.append(container_id)

    async def health(self) -> dict:
        return {"status": "ok" if self.started and not self.closed else "closed", "scripted": True}

    async def close(self) -> None:
        self.closed = True


def scripted_sandbox(outputs: dict[str, str] | None = None, delay_s: float = 0.0) -> ScriptedSandbox:
    """The scripted sandbox reporting 0.25 s per run; the loop reaches it through the real SandboxExecutor."""
    return ScriptedSandbox(outputs or {}, duration_s=0.25, delay_s=delay_s)
