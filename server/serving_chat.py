"""Chat completions: request -> agent-loop runs (one per choice) -> OpenAI response or SSE stream.

The built-in Python tool runs server-side inside the answer; the reasoning travels in `reasoning_content`
and each execution as a `code_cell` (extensions, docs/api.md). Client-declared function tools come back
the standard way (`tool_calls`, finish_reason `tool_calls`), with arguments streamed as generated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from rstar.server.agent_loop import TokensSampled
from rstar.server.containers import ContainerStore
from rstar.server.errors import APIError
from rstar.server.limits import AdmittedStream
from rstar.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatPrompt,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    CodeCell,
    FunctionCall,
    FunctionCallDelta,
    TokenizeRequest,
    TokenLogprob,
    ToolCallDelta,
    ToolCallOut,
    TopLogprob,
    Usage,
    new_id,
    weights_fingerprint,
)
from rstar.server.serving_agent import AgentPlan, AgentServing, Answer, Prompt
from rstar.server.serving_base import SSE_DONE, request_messages, sse
from rstar.server.tool_calls import TextDelta, ToolCallArgumentsDelta, ToolCallStarted

log = logging.getLogger("rstar.server")


class ChatService(AgentServing):
    """Chat completions. `owner` (server/auth.py key_owner): whose conversations a request stores into and may
    continue."""

    async def plan_request(self, request: ChatCompletionRequest, owner: str | None, containers: ContainerStore) -> AgentPlan:
        serving = self.serving
        serving.check_model(request.model)
        store = serving.store
        if request.conversation_id is not None and store is not None and not await asyncio.to_thread(store.exists, request.conversation_id, owner):
            raise APIError(404, f"No conversation with id {request.conversation_id!r}.", "conversation_id", "conversation_not_found")
        plan = self.plan(await self.chat_prompt(request), request)
        if request.container is not None:
            await self.use_container(plan, containers, request.container, owner, "container")
        return plan

    async def chat_prompt(self, request: ChatPrompt) -> Prompt:
        return await self.prompt(
            request_messages(request.messages),
            request.wire_tools,
            request.wire_tool_choice,
            request.builtin_tools,
            request.chat_template,
            request.chat_template_kwargs,
            request.continue_final_message,
            request.add_generation_prompt,
        )

    async def tokenize(self, request: TokenizeRequest) -> dict:
        """/tokenize: a text prompt as it is, or a chat request's prompt exactly as this endpoint renders it."""
        serving = self.serving
        if request.model is not None:
            serving.check_model(request.model)
        if request.messages is not None:
            tokens = (await self.chat_prompt(request)).ids
        else:
            tokens = serving.engine.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        return {"tokens": list(tokens), "count": len(tokens), "max_model_len": serving.engine.max_model_len}

    # -- non-streaming --------------------------------------------------------------------------------

    async def complete(self, request: ChatCompletionRequest, received_at: float, owner: str | None, containers: ContainerStore) -> ChatCompletion:
        plan = await self.plan_request(request, owner, containers)
        serving = self.serving
        logprobs: dict[int, list[TokenLogprob]] = {i: [] for i in range(request.n)}
        answers: dict[int, Answer] = {}
        async with serving.admission.slots(request.n), contextlib.aclosing(self.run_choices(plan, new_id("chatcmpl"), received_at)) as events:
            async for answer, pieces in events:
                answers[answer.index] = answer
                if request.logprobs:
                    logprobs[answer.index] += [e for p in pieces if isinstance(p, TokensSampled) for e in self._logprobs(p)]
        ordered = [answers[i] for i in range(request.n)]
        conversation_id = await self._store(request, ordered, received_at, owner)
        return ChatCompletion(
            model=request.model,
            choices=[
                ChatChoice(
                    index=a.index,
                    message=_message(a),
                    finish_reason=a.finish_reason,
                    logprobs=ChoiceLogprobs(content=logprobs[a.index]) if request.logprobs else None,
                    token_ids=a.trajectory.response_ids if request.return_token_ids else None,
                    response_mask=a.trajectory.response_mask if request.return_token_ids else None,
                )
                for a in ordered
            ],
            usage=_usage(plan, ordered),
            system_fingerprint=weights_fingerprint(ordered[0].trajectory.weight_version),
            conversation_id=conversation_id,
            prompt_token_ids=ordered[0].trajectory.prompt_ids if request.return_token_ids else None,
            tool_protocol=plan.config.tools.tool_protocol,
        )

    # -- streaming ------------------------------------------------------------------------------------

    async def stream(self, request: ChatCompletionRequest, received_at: float, owner: str | None, containers: ContainerStore) -> AdmittedStream:
        """Validate and admit first (errors become HTTP errors, not a broken stream), then stream SSE events."""
        plan = await self.plan_request(request, owner, containers)
        return await self.admitted_stream(request.n, self._sse(request, plan, received_at, owner))

    async def _sse(self, request: ChatCompletionRequest, plan: AgentPlan, received_at: float, owner: str | None) -> AsyncIterator[str]:
        serving = self.serving
        chunk_id, created = new_id("chatcmpl"), int(time.time())
        conversation_id = serving.store.new_id() if serving.store_requested(request.store) else None
        if request.conversation_id and conversation_id:
            conversation_id = request.conversation_id
        pending_logprobs: dict[int, list[TokenLogprob]] = {i: [] for i in range(request.n)}
        answers: dict[int, Answer] = {}

        fingerprint = weights_fingerprint(serving.engine.weight_version)

        def event(rows: list[ChunkChoice], usage: Usage | None = None, **top) -> str:
            chunk = ChatCompletionChunk(id=chunk_id, created=created, model=request.model, choices=rows, usage=usage, system_fingerprint=fingerprint, **top)
            return sse(chunk.model_dump_json(exclude_none=True))

        def logprobs_of(index: int) -> ChoiceLogprobs | None:
            if not request.logprobs or not pending_logprobs[index]:
                return None
            entries, pending_logprobs[index] = pending_logprobs[index], []
            return ChoiceLogprobs(content=entries)

        for index in range(request.n):
            first = {"conversation_id": conversation_id} if index == 0 else {}
            yield event([ChunkChoice(index=index, delta=ChoiceDelta(role="assistant", content=""))], **first)
        # Closed here, not left to the garbage collector: closing is what aborts the generations.
        async with contextlib.aclosing(self.run_choices(plan, chunk_id, received_at)) as events:
            async for answer, pieces in events:
                answers[answer.index] = answer
                for piece in pieces:
                    if isinstance(piece, TokensSampled):
                        if request.logprobs:
                            pending_logprobs[answer.index] += self._logprobs(piece)
                        continue
                    delta = _delta(answer, piece)
                    yield event([ChunkChoice(index=answer.index, delta=delta, logprobs=logprobs_of(answer.index))])
                if answer.trajectory is not None:
                    ids = request.return_token_ids
                    row = ChunkChoice(
                        index=answer.index,
                        delta=ChoiceDelta(),
                        finish_reason=answer.finish_reason,
                        logprobs=logprobs_of(answer.index),
                        token_ids=answer.trajectory.response_ids if ids else None,
                        response_mask=answer.trajectory.response_mask if ids else None,
                    )
                    top = {"prompt_token_ids": answer.trajectory.prompt_ids} if ids else {}
                    yield event([row], **top)
        ordered = [answers[i] for i in range(request.n)]
        await self._store(request, ordered, received_at, owner, conversation_id)
        if request.stream_options and request.stream_options.include_usage:
            yield event([], _usage(plan, ordered))
        yield SSE_DONE

    # -- helpers --------------------------------------------------------------------------------------

    def _logprobs(self, sampled: TokensSampled) -> list[TokenLogprob]:
        return [
            TokenLogprob(
                token=entry.token,
                logprob=entry.logprob,
                bytes=list(entry.token.encode()),
                top_logprobs=[TopLogprob(token=text, logprob=lp, bytes=list(text.encode())) for text, lp in entry.top],
            )
            for entry in self.decoded_logprobs(sampled.delta)
        ]

    async def _store(
        self, request: ChatCompletionRequest, answers: list[Answer], received_at: float, owner: str | None, conversation_id: str | None = None
    ) -> str | None:
        """Keep the exchange (unless opted out); returns the conversation id, or None when not stored."""
        serving = self.serving
        if not serving.store_requested(request.store):
            return None
        messages = request_messages(request.messages)
        reply = _stored_reply(answers[0])
        try:
            return await serving.store.save_exchange_async(
                request.model,
                messages,
                [reply],
                conversation_id=conversation_id or request.conversation_id,
                trajectories=[a.trajectory for a in answers],
                timings=[_timings(a, received_at) for a in answers],
                owner=owner,
            )
        except Exception:  # losing the log of an answer must not lose the answer itself
            log.exception("could not store the conversation")
            return None


def _timings(answer: Answer, received_at: float) -> dict:
    """Request-level times of one answer (tool calls carry their own in the trajectory)."""
    first = answer.first_token_at
    return {
        "time_to_first_token_s": None if first is None else round(first - received_at, 6),
        "duration_s": round(time.monotonic() - received_at, 6),
    }


def _message(answer: Answer) -> AssistantMessage:
    calls = [ToolCallOut(id=call_id, function=FunctionCall(name=call.name, arguments=call.arguments_json)) for call_id, call in answer.tool_calls()]
    return AssistantMessage(
        content=answer.content if answer.content or not calls else None,
        reasoning_content=answer.reasoning,
        tool_calls=calls or None,
        code_cells=sorted(answer.cells.values(), key=lambda cell: cell.index),
    )


def _stored_reply(answer: Answer) -> dict:
    message = _message(answer).model_dump(exclude_none=True)
    message["finish_reason"] = answer.finish_reason
    return message


def _delta(answer: Answer, piece) -> ChoiceDelta:
    if isinstance(piece, TextDelta):
        return ChoiceDelta(reasoning_content=piece.text) if piece.reasoning else ChoiceDelta(content=piece.text)
    if isinstance(piece, CodeCell):
        return ChoiceDelta(code_cell=piece)
    position = list(answer.client_calls).index(piece.index)
    if isinstance(piece, ToolCallStarted):
        call_id = answer.client_calls[piece.index][0]
        return ChoiceDelta(tool_calls=[ToolCallDelta(index=position, id=call_id, type="function", function=FunctionCallDelta(name=piece.name, arguments=""))])
    assert isinstance(piece, ToolCallArgumentsDelta)
    return ChoiceDelta(tool_calls=[ToolCallDelta(index=position, function=FunctionCallDelta(arguments=piece.text))])


def _usage(plan: AgentPlan, answers: list[Answer]) -> Usage:
    sampled = sum(a.trajectory.num_sampled_tokens for a in answers)
    tool_tokens = sum(len(a.trajectory.response_ids) for a in answers) - sampled
    executed = sum(1 for a in answers for call in a.trajectory.tool_calls if call.exec_status is not None)
    return Usage(
        prompt_tokens=plan.prompt_len, completion_tokens=sampled, total_tokens=plan.prompt_len + sampled, tool_tokens=tool_tokens, tool_calls=executed
    )
