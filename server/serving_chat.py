"""Chat completions: request -> prompt ids -> engine generations -> OpenAI response or SSE stream.

Plain chat with the model's own chat template. Each of the `n` choices is one engine generation; they share
the prompt, so vLLM's prefix cache computes it once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from rstar.server.conversations import ConversationStore
from rstar.server.engine import SamplingOptions, TokenDelta, TokenEngine
from rstar.server.errors import APIError
from rstar.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    TokenLogprob,
    TopLogprob,
    Usage,
    new_id,
)

log = logging.getLogger("rstar.server")


@dataclass
class _Choice:
    """One choice as it accumulates."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


class ChatService:
    def __init__(self, engine: TokenEngine, model_names: set[str], store: ConversationStore | None, store_by_default: bool):
        self.engine = engine
        self.model_names = model_names
        self.store = store
        self.store_by_default = store_by_default

    # -- request -> engine inputs ------------------------------------------------------------------

    def check_model(self, name: str) -> None:
        if name not in self.model_names:
            raise APIError(404, f"The model `{name}` does not exist. Available: {', '.join(sorted(self.model_names))}.", "model", "model_not_found")

    def render_prompt(self, request: ChatCompletionRequest) -> list[int]:
        messages = [{"role": m.role if m.role != "developer" else "system", "content": m.text()} for m in request.messages]
        text = self.engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.engine.tokenizer.encode(text, add_special_tokens=False)

    def sampling_options(self, request: ChatCompletionRequest, prompt_len: int, choice: int) -> SamplingOptions:
        room = self.engine.max_model_len - prompt_len
        limit = request.token_limit
        if room <= 0 or (limit is not None and limit > room):
            asked = f" plus {limit} completion tokens" if limit else ""
            raise APIError(
                400,
                f"This model's maximum context length is {self.engine.max_model_len} tokens. However, your request has "
                f"{prompt_len} input tokens{asked}. Please reduce the length of the messages or the completion.",
                "messages",
                "context_length_exceeded",
            )
        return SamplingOptions(
            max_tokens=limit or room,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=max(request.top_k, 0),
            # Distinct seeds per choice, so n > 1 with a seed gives n different but reproducible samples.
            seed=None if request.seed is None else request.seed + choice,
            stop=request.stop_list,
            logprobs=(request.top_logprobs or 0) if request.logprobs else None,
        )

    def prepare(self, request: ChatCompletionRequest) -> tuple[list[int], list[SamplingOptions]]:
        self.check_model(request.model)
        prompt_ids = self.render_prompt(request)
        return prompt_ids, [self.sampling_options(request, len(prompt_ids), i) for i in range(request.n)]

    # -- engine outputs -> wire ------------------------------------------------------------------

    def _logprobs(self, delta: TokenDelta) -> list[TokenLogprob]:
        if delta.logprobs is None:
            return []
        decode = self.engine.tokenizer.decode
        entries = []
        for position, (token_id, logprob) in enumerate(zip(delta.token_ids, delta.logprobs)):
            top = (delta.top_logprobs or [{}] * len(delta.token_ids))[position]
            token = decode([token_id])
            entries.append(
                TokenLogprob(
                    token=token,
                    logprob=logprob,
                    bytes=list(token.encode()),
                    top_logprobs=[TopLogprob(token=decode([t]), logprob=lp, bytes=list(decode([t]).encode())) for t, lp in sorted(top.items(), key=lambda kv: -kv[1])],
                )
            )
        return entries

    async def _store(self, request: ChatCompletionRequest, choices: list[_Choice]) -> None:
        keep = self.store_by_default if request.store is None else request.store
        if not (keep and self.store):
            return
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        replies = [{"role": "assistant", "content": c.text, "finish_reason": c.finish_reason, "choice": c.index} for c in choices]
        try:
            await self.store.save_exchange_async(request.model, messages, replies)
        except Exception:  # losing the log of an answer must not lose the answer itself
            log.exception("could not store the conversation")

    async def complete(self, request: ChatCompletionRequest) -> ChatCompletion:
        prompt_ids, options = self.prepare(request)
        choices = [_Choice(index=i) for i in range(request.n)]

        async def run(choice: _Choice, opts: SamplingOptions) -> None:
            async for delta in self.engine.generate(prompt_ids, opts):
                self._accumulate(choice, delta)

        await asyncio.gather(*(run(c, o) for c, o in zip(choices, options)))
        await self._store(request, choices)
        completion_tokens = sum(len(c.token_ids) for c in choices)
        return ChatCompletion(
            model=request.model,
            choices=[
                ChatChoice(
                    index=c.index,
                    message=AssistantMessage(content=c.text),
                    finish_reason=c.finish_reason,
                    logprobs=ChoiceLogprobs(content=c.logprobs) if request.logprobs else None,
                )
                for c in choices
            ],
            usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens, total_tokens=len(prompt_ids) + completion_tokens),
        )

    def _accumulate(self, choice: _Choice, delta: TokenDelta) -> list[TokenLogprob]:
        choice.text += delta.text
        choice.token_ids += delta.token_ids
        entries = self._logprobs(delta)
        choice.logprobs += entries
        if delta.finished:
            choice.finish_reason = delta.finish_reason
        return entries

    async def stream(self, request: ChatCompletionRequest) -> AsyncIterator[str]:
        """Validate first (errors become HTTP errors, not a broken stream), then yield SSE events."""
        prompt_ids, options = self.prepare(request)
        return self._sse(request, prompt_ids, options)

    async def _sse(self, request: ChatCompletionRequest, prompt_ids: list[int], options: list[SamplingOptions]) -> AsyncIterator[str]:
        chunk_id, created = new_id("chatcmpl"), int(time.time())
        choices = [_Choice(index=i) for i in range(request.n)]

        def event(choice_rows: list[ChunkChoice], usage: Usage | None = None) -> str:
            chunk = ChatCompletionChunk(id=chunk_id, created=created, model=request.model, choices=choice_rows, usage=usage)
            return f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"

        for choice in choices:
            yield event([ChunkChoice(index=choice.index, delta=ChoiceDelta(role="assistant", content=""))])
        async for index, delta in _merge([self.engine.generate(prompt_ids, opts) for opts in options]):
            entries = self._accumulate(choices[index], delta)
            row = ChunkChoice(
                index=index,
                delta=ChoiceDelta(content=delta.text),
                finish_reason=delta.finish_reason if delta.finished else None,
                logprobs=ChoiceLogprobs(content=entries) if request.logprobs else None,
            )
            yield event([row])
        await self._store(request, choices)
        if request.stream_options and request.stream_options.include_usage:
            completion_tokens = sum(len(c.token_ids) for c in choices)
            usage = Usage(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens, total_tokens=len(prompt_ids) + completion_tokens)
            yield event([], usage)
        yield "data: [DONE]\n\n"


async def _merge(streams: list[AsyncIterator[TokenDelta]]) -> AsyncIterator[tuple[int, TokenDelta]]:
    """Interleave several generations as their deltas arrive, tagged with their index.

    Closing the merged iterator (client gone) cancels the pumps, which closes every generation and so
    aborts it in the engine.
    """
    if len(streams) == 1:
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: AsyncIterator[TokenDelta]) -> None:
        try:
            async for delta in stream:
                await queue.put((index, delta))
        finally:
            await queue.put((index, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
                continue
            yield index, item
        for task in tasks:
            task.result()  # surface an engine error from any choice
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def sse_error(message: str) -> str:
    """An error after the stream began: OpenAI clients read an `error` event and raise."""
    return f"data: {json.dumps({'error': {'message': message, 'type': 'server_error', 'code': 500}})}\n\n"
