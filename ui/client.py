"""The UI's HTTP client to the rstar API (local or remote): chat streaming, conversations, containers, eval runs.

Every failure becomes an `ApiError` whose message a person can act on; the page shows that message and
never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


class ApiError(Exception):
    """A failure worded for the page."""


@dataclass(frozen=True)
class StreamEvent:
    """One thing that happened in a streamed answer.

    kind: "started" (value: conversation id or None), "reasoning" / "content" (value: text),
    "cell" (value: code-cell dict), "finished" (value: finish reason).
    """

    kind: str
    value: Any


def _error_message(response: httpx.Response) -> str:
    """The server's OpenAI-shaped error message, or a plain description of the status."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text.strip()[:300] or response.reason_phrase
    if response.status_code == 503:
        return f"The server is not ready (model loading?): {message}"
    return f"The server answered {response.status_code}: {message}"


def chunk_events(chunk: dict[str, Any]) -> list[StreamEvent]:
    """The events in one SSE chunk of /v1/chat/completions (only choice 0: the UI asks for n=1)."""
    if "error" in chunk:
        error = chunk["error"]
        raise ApiError(f"The generation failed on the server: {error.get('message', error) if isinstance(error, dict) else error}")
    events = []
    if "conversation_id" in chunk:
        events.append(StreamEvent("started", chunk["conversation_id"]))
    for choice in chunk.get("choices") or []:
        if choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or {}
        if delta.get("reasoning_content"):
            events.append(StreamEvent("reasoning", delta["reasoning_content"]))
        if delta.get("code_cell"):
            events.append(StreamEvent("cell", delta["code_cell"]))
        if delta.get("content"):
            events.append(StreamEvent("content", delta["content"]))
        if choice.get("finish_reason"):
            events.append(StreamEvent("finished", choice["finish_reason"]))
    return events


class ApiClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 10.0):
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout

    def _client(self, stream: bool = False) -> httpx.AsyncClient:
        # A client per call: Gradio may run handlers on different event loops, which a shared pool would not survive.
        # A stream has no read timeout: a long tool call legitimately leaves it quiet for a while.
        timeout = httpx.Timeout(self.timeout, read=None if stream else self.timeout)
        return httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=timeout)

    def _unreachable(self, exc: httpx.HTTPError) -> ApiError:
        if isinstance(exc, httpx.TimeoutException):
            return ApiError(f"The server at {self.base_url} did not answer in time (still loading the model?).")
        return ApiError(f"Cannot reach the server at {self.base_url}: is `rstar serve` running? ({type(exc).__name__})")

    async def _get(self, path: str, **params: Any) -> Any:
        try:
            async with self._client() as client:
                response = await client.get(path, params={k: v for k, v in params.items() if v is not None})
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code != 200:
            raise ApiError(_error_message(response))
        return response.json() if "json" in response.headers.get("content-type", "") else response.content

    async def health(self) -> dict[str, Any]:
        return await self._get("/health")

    async def models(self) -> list[str]:
        return [model["id"] for model in (await self._get("/v1/models"))["data"]]

    async def conversations(self, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        return (await self._get("/v1/conversations", limit=limit, offset=offset))["data"]

    async def conversation(self, conversation_id: str) -> dict[str, Any]:
        return await self._get(f"/v1/conversations/{conversation_id}")

    async def _send(self, method: str, path: str, payload: Any = None) -> Any:
        try:
            async with self._client() as client:
                response = await client.request(method, path, json=payload)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code not in (200, 202, 204):
            raise ApiError(_error_message(response))
        return response.json() if response.content else None

    async def delete_conversation(self, conversation_id: str) -> None:
        await self._send("DELETE", f"/v1/conversations/{conversation_id}")

    async def create_container(self, name: str) -> str:
        """A new container of the UI's key (/v1/containers): its id."""
        return (await self._send("POST", "/v1/containers", {"name": name}))["id"]

    async def container_exists(self, container_id: str) -> bool:
        """Whether the container is still there (False once it expired or was deleted: a 404)."""
        try:
            async with self._client() as client:
                response = await client.get(f"/v1/containers/{container_id}")
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code not in (200, 404):
            raise ApiError(_error_message(response))
        return response.status_code == 200

    async def upload_to_container(self, container_id: str, path: Path) -> dict[str, Any]:
        """Put the file at `path` (on the UI's machine) into the container, under its own name."""
        try:
            async with self._client() as client:
                with path.open("rb") as content:
                    response = await client.post(f"/v1/containers/{container_id}/files", files={"file": (path.name, content)})
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code != 200:
            raise ApiError(_error_message(response))
        return response.json()

    async def container_files(self, container_id: str) -> list[dict[str, Any]]:
        """The container's files, oldest first (its first 100: a container holds no more by default)."""
        return (await self._get(f"/v1/containers/{container_id}/files", limit=100, order="asc"))["data"]

    async def container_file_content(self, container_id: str, file_id: str) -> bytes:
        return await self._get(f"/v1/containers/{container_id}/files/{file_id}/content")

    async def rl_runs(self) -> list[dict[str, Any]]:
        return (await self._get("/v1/rl/runs"))["data"]

    async def rl_run(self, run_id: str) -> dict[str, Any]:
        return await self._get(f"/v1/rl/runs/{run_id}")

    async def start_rl_run(self, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._send("POST", "/v1/rl/runs", payload)

    async def cancel_rl_run(self, run_id: str) -> dict[str, Any]:
        return await self._send("POST", f"/v1/rl/runs/{run_id}/cancel")

    async def eval_runs(self) -> list[dict[str, Any]]:
        return (await self._get("/v1/evals/runs"))["data"]

    async def eval_run(self, run_id: str) -> dict[str, Any]:
        return await self._get(f"/v1/evals/runs/{run_id}")

    async def eval_samples(self, run_id: str, benchmark: str | None = None, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        return await self._get(f"/v1/evals/runs/{run_id}/samples", benchmark=benchmark or None, limit=limit, offset=offset)

    async def eval_sample(self, run_id: str, sample_id: int) -> dict[str, Any]:
        return await self._get(f"/v1/evals/runs/{run_id}/samples/{sample_id}")

    async def eval_file(self, run_id: str, name: str) -> bytes:
        return await self._get(f"/v1/evals/runs/{run_id}/files/{name}")

    async def stream_chat(self, payload: dict[str, Any]) -> AsyncIterator[StreamEvent]:
        """Stream one completion. Leaving the loop early (the stop button cancels the task) closes the
        connection, which is what aborts the generation on the server."""
        try:
            async with self._client(stream=True) as client:
                async with client.stream("POST", "/v1/chat/completions", json={**payload, "stream": True}) as response:
                    if response.status_code != 200:
                        await response.aread()
                        raise ApiError(_error_message(response))
                    async for line in response.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[len("data:") :].strip()
                        if data == "[DONE]":
                            return
                        for event in chunk_events(json.loads(data)):
                            yield event
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
