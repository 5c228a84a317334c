"""Turning a chat request's messages, tools and options into agent-loop runs (`prompt`, `plan`, `run_choices`),
and folding loop events into one answer per choice (`Answer`), which chat completions and responses then
put on the wire in their own shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rstar.sandbox.tools import BUILTIN_TOOLS, PYTHON_TOOL, ToolSettings
from rstar.server.agent_loop import Done, LoopConfig, LoopEvent, TokensSampled, ToolExecutionStarted, ToolResult, TurnStarted, run_agent
from rstar.server.builtin_tools import SandboxExecutor, builtin_tool_schemas
from rstar.server.containers import ContainerStore, memory_mb
from rstar.server.chat_template import ChatTemplate, RenderTimeout, content_text
from rstar.server.engine import SamplingOptions
from rstar.server.errors import APIError, naming_field
from rstar.server.metrics import SANDBOX_FAILURES, ServerMetrics
from rstar.server.schemas import ChatCompletionRequest, CodeCell
from rstar.server.schemas_responses import ResponsesRequest
from rstar.server.serving_base import ServingBase, merge, per_choice, render_timeout_error
from rstar.server.tool_calls import CALL_CLOSE, CALL_OPEN, TextDelta, ToolCall, ToolCallArgumentsDelta, ToolCallEnded, ToolCallStarted
from rstar.server.trajectory import ToolCallRecord, Trajectory, openai_finish_reason


# The requests the agent loop answers; both say how they sample (`sampling_options`) and what they ask of the loop.
AgentRequest = ChatCompletionRequest | ResponsesRequest


@dataclass(frozen=True)
class Prompt:
    """A request's prompt as the agent loop starts from it, rendered and encoded once (`AgentServing.prompt`)."""

    template: ChatTemplate
    messages: list[dict]  # the request's, with the opening of a forced tool call when tool_choice asks for one
    tools: list[dict]  # listed in the prompt: the built-in tool, then the client's
    client_tools: frozenset[str]  # names of the client's tools the model may call
    builtin_tools: bool
    continue_final_message: bool
    ids: list[int]


@dataclass
class AgentPlan:
    """One request, ready for the loop: its prompt, what may be called, and how each choice samples."""

    prompt: Prompt
    config: LoopConfig
    sampling: list[SamplingOptions]  # one per choice
    executor: SandboxExecutor
    made_container: str | None = None  # a container made for this request alone (Responses' auto with file_ids)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt.ids)


def forced_call_prefix(tool_choice: Any) -> str | None:
    """Text that makes the answer start with a tool call: tool_choice 'required' opens a call and leaves the
    name to the model; a named choice writes the name too. Generation continues from there."""
    if tool_choice == "required":
        return CALL_OPEN + '\n{"name": "'
    if isinstance(tool_choice, Mapping):
        return CALL_OPEN + '\n{"name": ' + json.dumps(tool_choice["function"]["name"]) + ', "arguments": '
    return None


class AgentServing(ServingBase):
    """The base of the endpoints that answer through the agent loop (chat completions, responses)."""

    async def prompt(
        self,
        messages: Sequence[Mapping],
        client_tools: Sequence[Mapping],
        tool_choice: Any,
        builtin_tools: bool,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        continue_final_message: bool = False,
        add_generation_prompt: bool = True,
    ) -> Prompt:
        """Render and encode a request's prompt, once, off the event loop (APIError 400 when the template
        cannot). /tokenize renders through here too, so it shows exactly the prompt the model is sent."""
        template = self.serving.template_for(chat_template, chat_template_kwargs)
        messages = [dict(message) for message in messages]
        offered = [] if tool_choice == "none" else [dict(tool) for tool in client_tools]
        tools = (builtin_tool_schemas([PYTHON_TOOL]) if builtin_tools else []) + offered
        prefix = forced_call_prefix(tool_choice)
        if prefix is not None:
            if continue_final_message:
                messages[-1]["content"] = content_text(messages[-1].get("content")) + prefix
            else:
                messages.append({"role": "assistant", "content": template.generation_prefix + prefix})
            continue_final_message = True

        def encode() -> list[int]:
            if continue_final_message:
                return template.encode_continuation(messages, tools)
            return template.encode(messages, tools, add_generation_prompt)

        try:
            ids = await self.off_loop(encode)
        except RenderTimeout:
            raise render_timeout_error("messages") from None
        except Exception as exc:  # a template that cannot render these messages (roles, order)
            raise APIError(400, f"the chat template cannot render these messages: {exc}", "messages") from exc
        client_names = frozenset(tool["function"]["name"] for tool in offered)
        return Prompt(template, messages, tools, client_names, builtin_tools, continue_final_message, ids)

    def plan(self, prompt: Prompt, request: AgentRequest) -> AgentPlan:
        """Validate a request against the server's limits and the context window (APIError 400 when it does
        not fit); each choice samples as the request says, within the room the prompt leaves."""
        serving = self.serving
        settings = serving.settings.api
        max_turns = request.max_turns or settings.max_turns
        if max_turns > settings.max_turns_limit:
            raise APIError(400, f"max_turns may be at most {settings.max_turns_limit}", "max_turns")
        room = self.context_room(len(prompt.ids), request.token_limit)
        protocol = request.tool_protocol or serving.tool_protocol
        config = LoopConfig(
            max_turns=max_turns,
            max_response_tokens=request.token_limit,
            # One built-in call per turn under both protocols, as released (verl's max_parallel_calls=1); the
            # released loop had no client tools, so clients may get parallel calls of their own tools.
            max_parallel_calls=16 if prompt.client_tools else 1,
            tools=ToolSettings.of_protocol(protocol, settings.max_tool_response_chars),
            client_tools=prompt.client_tools,
            builtin_tools=BUILTIN_TOOLS if prompt.builtin_tools else frozenset(),
            token_events=True,
            # Logprobs cost the engine a log-softmax per step and its frontend Python objects per token, so
            # they are computed only when asked for; stored trajectories then carry logprobs null.
            logprobs=request.logprobs,
            top_logprobs=(request.top_logprobs or 0) if request.logprobs else 0,
        )
        tool_timeout_limit = min(settings.max_tool_timeout_s, serving.settings.sandbox.max_timeout_s)
        if request.tool_timeout is not None and request.tool_timeout > tool_timeout_limit:
            limit = "server settings api.max_tool_timeout_s, sandbox.max_timeout_s"
            raise APIError(400, f"tool_timeout may be at most {tool_timeout_limit:g} s ({limit})", "tool_timeout")
        executor = SandboxExecutor(serving.sandbox, request.tool_timeout, cells=settings.sandbox_cells_per_request)
        return AgentPlan(prompt, config, per_choice(request.sampling_options(room, serving.sampling_defaults), request.n), executor)

    async def use_container(self, plan: AgentPlan, containers: ContainerStore, container_id: str, owner: str | None, field: str) -> None:
        """Run the plan's cells in that container (its interpreter and files, its memory_limit); an unknown,
        expired or another key's container is refused naming `field`, the request's field that named it."""
        with naming_field(field):
            container = await asyncio.to_thread(containers.use, container_id, owner)
        plan.executor = plan.executor.in_container(container.id, memory_mb(container.memory_limit))

    async def run_choices(self, plan: AgentPlan, request_id: str, received_at: float) -> AsyncIterator[tuple[Answer, list[Any]]]:
        """Run every choice's loop concurrently, yielding (answer, stream pieces) as events arrive, until the
        request's deadline; the caller holds the admission slots. Closing this iterator closes every loop,
        which aborts its engine request and cancels its sandbox jobs."""
        serving = self.serving
        answers = [Answer(i, plan.config.client_tools, bool(plan.config.builtin_tools or plan.config.client_tools)) for i in range(len(plan.sampling))]
        streams = [
            run_agent(
                serving.engine,
                plan.prompt.template,
                plan.prompt.messages,
                plan.prompt.tools,
                sampling,
                plan.executor,
                plan.config,
                request_id=f"{request_id}-{i}",
                continue_final_message=plan.prompt.continue_final_message,
                prompt_ids=plan.prompt.ids,
            )
            for i, sampling in enumerate(plan.sampling)
        ]
        events = self.guarded(merge(streams), generated=lambda: any(answer.sampled_tokens for answer in answers))
        async with contextlib.aclosing(events) as timed:
            async for index, event in timed:
                answer = answers[index]
                pieces = answer.apply(event)
                if isinstance(event, ToolResult):
                    _count_tool_call(serving.metrics, event.record)
                if isinstance(event, Done):
                    _count_tokens(serving.metrics, answer, plan.prompt_len, received_at)
                yield answer, pieces


@dataclass
class Answer:
    """One choice as its events arrive: text, reasoning, code cells, the client's tool calls, timings."""

    index: int
    client_tools: frozenset[str]
    runs_tools: bool
    content: str = ""
    reasoning: str = ""
    cells: dict[int, CodeCell] = field(default_factory=dict)
    client_calls: dict[int, tuple[str, ToolCall | None]] = field(default_factory=dict)  # call index -> (id, call once ended)
    trajectory: Trajectory | None = None
    first_token_at: float | None = None
    sampled_tokens: int = 0

    @property
    def finish_reason(self) -> str:
        return openai_finish_reason(self.trajectory.stop_reason if self.trajectory else "abort")

    def tool_calls(self) -> list[tuple[str, ToolCall]]:
        """The client tool calls of the answer's last turn, as (id, call)."""
        return [(call_id, call) for call_id, call in self.client_calls.values() if call is not None]

    def apply(self, event: LoopEvent) -> list[Any]:
        """Fold one event in; return what it adds for a stream (text pieces, cells, client call pieces)."""
        if isinstance(event, TokensSampled):
            self.sampled_tokens += len(event.delta.token_ids)
            if self.first_token_at is None and event.delta.token_ids:
                self.first_token_at = time.monotonic()
            return [event]  # carries the logprobs
        if isinstance(event, TurnStarted):
            # Only the last turn's client calls are the answer's; earlier turns' calls were built-in.
            self.client_calls = {}
            return []
        if isinstance(event, TextDelta):
            if event.reasoning:
                self.reasoning += event.text
            else:
                self.content += event.text
            return [event]
        if isinstance(event, ToolCallStarted):
            if event.name in self.client_tools:
                self.client_calls[event.index] = ("call_" + uuid.uuid4().hex[:24], None)
                return [event]
            return []
        if isinstance(event, ToolCallArgumentsDelta):
            return [event] if event.index in self.client_calls else []
        if isinstance(event, ToolCallEnded):
            if event.call.index in self.client_calls:
                if event.complete and event.call.decode_error is None:
                    self.client_calls[event.call.index] = (self.client_calls[event.call.index][0], event.call)
                    return []
                # Its start named a client tool but the whole span does not decode: the loop answers it
                # as a failed call (the model hears the decode error), so it is no call for the client.
                del self.client_calls[event.call.index]
            if not event.complete or not self.runs_tools:
                # Not a call the server acts on (cut off, or plain chat): it stays part of the text.
                text = CALL_OPEN + event.call.raw + (CALL_CLOSE if event.complete else "")
                self.content += text
                return [TextDelta(text, reasoning=False)]
            return []
        if isinstance(event, ToolExecutionStarted):
            cell = CodeCell(index=event.index, name=event.name, code=event.code, status="running")
            self.cells[event.index] = cell
            return [cell]
        if isinstance(event, ToolResult):
            cell = CodeCell.of_record(event.record)
            if cell is None:
                return []
            self.cells[cell.index] = cell
            return [cell]
        if isinstance(event, Done):
            self.trajectory = event.trajectory
        return []


def _count_tool_call(metrics: ServerMetrics, record: ToolCallRecord) -> None:
    if record.response is None:
        return
    status = record.exec_status or "invalid_input"
    name = record.name if isinstance(record.name, str) and record.name in BUILTIN_TOOLS else "other"
    metrics.tool_calls.labels(name, status).inc()
    if record.exec_status is not None:
        metrics.tool_latency.labels(name).observe(record.wall_s or 0.0)
    if status in SANDBOX_FAILURES:
        metrics.sandbox_failures.inc()


def _count_tokens(metrics: ServerMetrics, answer: Answer, prompt_len: int, received_at: float) -> None:
    trajectory = answer.trajectory
    metrics.prompt_tokens.inc(prompt_len)
    metrics.generation_tokens.inc(trajectory.num_sampled_tokens)
    metrics.tool_tokens.inc(len(trajectory.response_ids) - trajectory.num_sampled_tokens)
    if answer.first_token_at is not None:
        metrics.time_to_first_token.observe(answer.first_token_at - received_at)
