"""`/v1/responses`: the agent loop in OpenAI's Responses shapes.

Server-side code runs appear as `code_interpreter_call` output items, with their streamed events
(`response.code_interpreter_call.in_progress`, `..._code.delta/.done`, `.interpreting`, `.completed`);
reasoning as `reasoning` items, the answer as a `message` item, client function calls as `function_call`
items. One builder (`_ResponseBuilder`) produces the stream events; a non-streaming request runs the same
builder and returns its final response, so both agree by construction.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from rstar.server.agent_loop import TokensSampled
from rstar.server.auto_container import container_with_files
from rstar.server.citations import file_citations
from rstar.server.containers import ContainerStore
from rstar.server.errors import APIError
from rstar.server.files import FileStore
from rstar.server.limits import AdmittedStream
from rstar.server.schemas import CodeCell
from rstar.server.schemas_responses import FunctionTool, ResponsesRequest
from rstar.server.serving_agent import AgentPlan, AgentServing, Answer
from rstar.server.serving_base import sse
from rstar.server.tool_calls import TextDelta, ToolCallArgumentsDelta, ToolCallStarted

# Sandbox statuses under which the code ran to its end (a program error is still a completed run).
_COMPLETED = frozenset({"ok", "error"})


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _ResponseBuilder:
    """Turns an Answer's stream pieces into Responses events and output items."""

    def __init__(self, request: ResponsesRequest, response_id: str, container_id: str):
        self.request = request
        self.response_id = response_id
        self.container_id = container_id
        self.created_at = int(time.time())
        self.output: list[dict] = []
        self.sequence = 0
        self.open_text: dict | None = None  # the message or reasoning item text is streaming into
        self.cells: dict[int, dict] = {}  # call index -> code_interpreter_call item
        self.calls: dict[int, dict] = {}  # call index -> function_call item

    def event(self, kind: str, **fields) -> dict:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def response(self, status: str, usage: dict | None = None) -> dict:
        request = self.request
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": request.model,
            "output": self.output,
            "instructions": request.instructions,
            "tools": [tool.model_dump(exclude_none=True) for tool in request.tools],
            "tool_choice": request.tool_choice if isinstance(request.tool_choice, str) else "auto",
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "max_output_tokens": request.max_output_tokens,
            "incomplete_details": incomplete,
            "error": None,
            "metadata": request.metadata or {},
            "text": {"format": {"type": "text"}},
            "usage": usage,
        }

    def start(self) -> list[dict]:
        snapshot = self.response("in_progress")
        return [self.event("response.created", response=snapshot), self.event("response.in_progress", response=snapshot)]

    def _add(self, item: dict) -> dict:
        self.output.append(item)
        return self.event("response.output_item.added", output_index=len(self.output) - 1, item=item)

    def last_message(self) -> dict | None:
        """The answer's last message item: where its file citations go."""
        return next((item for item in reversed(self.output) if item["type"] == "message"), None)

    def _index(self, item: dict) -> int:
        return next(i for i, candidate in enumerate(self.output) if candidate is item)

    def close_text(self) -> list[dict]:
        item, self.open_text = self.open_text, None
        if item is None:
            return []
        index = self._index(item)
        item["status"] = "completed"
        if item["type"] == "reasoning":
            part = item["content"][0]
            return [
                self.event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=part["text"]),
                self.event("response.output_item.done", output_index=index, item=item),
            ]
        part = item["content"][0]
        return [
            self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=part["text"], logprobs=[]),
            self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def piece(self, answer: Answer, piece: Any) -> list[dict]:
        if isinstance(piece, TextDelta):
            return self._text(piece)
        if isinstance(piece, CodeCell):
            return self._cell(piece)
        if isinstance(piece, ToolCallStarted):
            events = self.close_text()
            call_id = answer.client_calls[piece.index][0]
            item = {"type": "function_call", "id": _item_id("fc"), "call_id": call_id, "name": piece.name, "arguments": "", "status": "in_progress"}
            self.calls[piece.index] = item
            return events + [self._add(item)]
        if isinstance(piece, ToolCallArgumentsDelta):
            item = self.calls[piece.index]
            item["arguments"] += piece.text
            return [self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=self._index(item), delta=piece.text)]
        return []

    def _text(self, piece: TextDelta) -> list[dict]:
        kind = "reasoning" if piece.reasoning else "message"
        events = []
        if self.open_text is None or self.open_text["type"] != kind:
            events += self.close_text()
            if piece.reasoning:
                item = {"type": "reasoning", "id": _item_id("rs"), "summary": [], "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
                events.append(self._add(item))
            else:
                item = {"type": "message", "id": _item_id("msg"), "role": "assistant", "status": "in_progress", "content": []}
                events.append(self._add(item))
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                item["content"].append(part)
                events.append(self.event("response.content_part.added", item_id=item["id"], output_index=self._index(item), content_index=0, part=dict(part)))
            self.open_text = item
        item = self.open_text
        item["content"][0]["text"] += piece.text
        index = self._index(item)
        if piece.reasoning:
            events.append(self.event("response.reasoning_text.delta", item_id=item["id"], output_index=index, content_index=0, delta=piece.text))
        else:
            events.append(self.event("response.output_text.delta", item_id=item["id"], output_index=index, content_index=0, delta=piece.text, logprobs=[]))
        return events

    def _cell(self, cell: CodeCell) -> list[dict]:
        events = self.close_text()
        item = self.cells.get(cell.index)
        if item is None:  # the call starts: announce it, its code, and that it is being interpreted
            item = {"type": "code_interpreter_call", "id": _item_id("ci"), "code": cell.code, "container_id": self.container_id, "outputs": None, "status": "in_progress"}
            self.cells[cell.index] = item
            events.append(self._add(item))
            index = self._index(item)
            events += [
                self.event("response.code_interpreter_call.in_progress", item_id=item["id"], output_index=index),
                self.event("response.code_interpreter_call_code.delta", item_id=item["id"], output_index=index, delta=cell.code),
                self.event("response.code_interpreter_call_code.done", item_id=item["id"], output_index=index, code=cell.code),
                self.event("response.code_interpreter_call.interpreting", item_id=item["id"], output_index=index),
            ]
            item["status"] = "interpreting"
        if cell.status == "running":
            return events
        index = self._index(item)
        logs = cell.stdout + (("\n" if cell.stdout and cell.stderr else "") + cell.stderr)
        if cell.image_notes:  # why figures are missing: the outputs have no other place to say it
            logs = "\n".join([logs.rstrip("\n")] * bool(logs) + [f"[{note}]" for note in cell.image_notes])
        # OpenAI's code_interpreter_call outputs: the logs, then each image the cell made.
        item["outputs"] = ([{"type": "logs", "logs": logs}] if logs else []) + [{"type": "image", "url": url} for url in cell.images]
        item["status"] = "completed" if cell.status in _COMPLETED else "failed"
        events += [
            self.event("response.code_interpreter_call.completed", item_id=item["id"], output_index=index),
            self.event("response.output_item.done", output_index=index, item=item),
        ]
        return events

    def finish(self, answer: Answer, prompt_len: int) -> list[dict]:
        events = self.close_text()
        for item in self.calls.values():
            index = self._index(item)
            item["status"] = "completed"
            events += [
                self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=item),
            ]
        trajectory = answer.trajectory
        sampled = trajectory.num_sampled_tokens
        usage = {
            "input_tokens": prompt_len,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": sampled,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_len + sampled,
        }
        status = "incomplete" if answer.finish_reason == "length" else "completed"
        final = self.response(status, usage)
        return events + [self.event(f"response.{status}", response=final)]


class ResponsesService(AgentServing):
    async def plan_request(self, request: ResponsesRequest, containers: ContainerStore, files: FileStore, owner: str | None) -> AgentPlan:
        self.serving.check_model(request.model)
        functions = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)} for tool in request.tools if isinstance(tool, FunctionTool)
        ]
        choice = request.tool_choice.model_dump() if hasattr(request.tool_choice, "model_dump") else request.tool_choice
        # The built-in tool is OpenAI's code_interpreter here: offered when the request lists it.
        builtin = request.code_interpreter and request.builtin_tools
        prompt = await self.prompt(request.chat_messages(), functions, choice, builtin, request.chat_template, request.chat_template_kwargs)
        plan = self.plan(prompt, request)
        if (named := request.named_container()) is not None:
            container_id, field = named
            await self.use_container(plan, containers, container_id, owner, field)
        elif (auto := request.auto_container()) is not None:
            settings, field = auto
            container = await asyncio.to_thread(container_with_files, containers, files, settings, owner, field)
            await self.use_container(plan, containers, container.id, owner, field)
            plan.made_container = container.id
        return plan

    async def admit(self, plan: AgentPlan, containers: ContainerStore, owner: str | None) -> None:
        """The response's admission slot. A request turned away (429) or gone while it waited leaves nothing:
        the container it made for its files is removed again."""
        try:
            await self.serving.admission.acquire(1)
        except BaseException:
            if plan.made_container is not None:
                await asyncio.to_thread(containers.delete, plan.made_container, owner)
            raise

    async def _events(self, request: ResponsesRequest, plan: AgentPlan, received_at: float, containers: ContainerStore, owner: str | None) -> AsyncIterator[dict]:
        response_id = _item_id("resp")
        container_id = plan.executor.container_id
        before = {f.id: f.bytes for f in await asyncio.to_thread(containers.list_files, container_id, owner)} if container_id else {}
        builder = _ResponseBuilder(request, response_id, container_id=plan.executor.container_id or _item_id("cntr"))
        for event in builder.start():
            yield event
        answers = self.run_choices(plan, response_id, received_at)
        async with contextlib.aclosing(answers):  # closing aborts the generation and its tool runs
            async for answer, pieces in answers:
                for piece in pieces:
                    if not isinstance(piece, TokensSampled):
                        for event in builder.piece(answer, piece):
                            yield event
                if answer.trajectory is not None:
                    if container_id and (message := builder.last_message()) is not None:
                        with contextlib.suppress(APIError):  # the container expired or was deleted meanwhile: nothing to cite
                            files = await asyncio.to_thread(containers.list_files, container_id, owner)
                            part = message["content"][0]
                            part["annotations"] = file_citations(part["text"], container_id, files, before, [c.code for c in answer.cells.values()])
                    for event in builder.finish(answer, plan.prompt_len):
                        yield event

    async def create(self, request: ResponsesRequest, received_at: float, containers: ContainerStore, files: FileStore, owner: str | None) -> dict:
        plan = await self.plan_request(request, containers, files, owner)
        final = None
        await self.admit(plan, containers, owner)
        try:
            async with contextlib.aclosing(self._events(request, plan, received_at, containers, owner)) as events:
                async for event in events:
                    final = event
        finally:
            await self.serving.admission.release(1)
        if final is None or "response" not in final:
            raise APIError(500, "the response ended without a result")
        return final["response"]

    async def stream(self, request: ResponsesRequest, received_at: float, containers: ContainerStore, files: FileStore, owner: str | None) -> AdmittedStream:
        plan = await self.plan_request(request, containers, files, owner)
        await self.admit(plan, containers, owner)
        return AdmittedStream(self.serving.admission, 1, self._sse(request, plan, received_at, containers, owner))

    async def _sse(self, request: ResponsesRequest, plan: AgentPlan, received_at: float, containers: ContainerStore, owner: str | None) -> AsyncIterator[str]:
        async with contextlib.aclosing(self._events(request, plan, received_at, containers, owner)) as events:
            async for event in events:
                yield sse(json.dumps(event, ensure_ascii=False), event["type"])

