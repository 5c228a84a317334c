"""What every generating endpoint shares, in the shape of vLLM's `OpenAIServing`: the server's long-lived
state (`Serving`) and a base class (`ServingBase`) holding admission, the request deadline, the
context-window check, per-choice seeds, logprob decoding, SSE framing and the rule that an input the engine
refuses is the client's fault. The endpoint services (`serving_chat`, `serving_completions`,
`serving_responses`) subclass it and keep only their wire shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rstar.config import Settings
from rstar.sandbox.clients import SandboxClient
from rstar.sandbox.tools import ToolProtocol
from rstar.server.chat_template import ChatTemplate, RenderTimeout, choose_template, render_deadline
from rstar.server.conversations import ConversationStore
from rstar.server.engine import SamplingOptions, TokenDelta, TokenEngine
from rstar.server.errors import APIError
from rstar.server.limits import Admission, AdmittedStream, with_deadline
from rstar.server.metrics import ServerMetrics

T = TypeVar("T")

SSE_DONE = "data: [DONE]\n\n"
# Template variants kept for reuse (per template choice and chat_template_kwargs); more are built per request.
MAX_CACHED_TEMPLATES = 32
# Threads that render and tokenize prompts, off the event loop. Their own few, so renders that ran into their
# time limit cannot take the threads database work needs.
RENDER_THREADS = 4


@dataclass
class Serving:
    """The server's long-lived parts, built once in the app's lifespan and shared by every endpoint."""

    engine: TokenEngine
    template: ChatTemplate  # the server's choice for its model
    sandbox: SandboxClient
    model_names: set[str]
    store: ConversationStore | None
    settings: Settings
    metrics: ServerMetrics
    admission: Admission
    tool_protocol: ToolProtocol  # the server's choice for its model; a request may pick the other
    sampling_defaults: dict[str, float]  # penalties a request that leaves them out gets (the model's recommended ones)

    # Per-request choices, built once each: by template name, and by (name, chat_template_kwargs) so a
    # benchmark sending the same variables with every request does not compile the template every time.
    templates: dict[Any, ChatTemplate] = field(default_factory=dict)
    renderer: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="rstar-render"))

    def template_for(self, kind: str | None, variables: Mapping[str, Any] | None = None) -> ChatTemplate:
        """The template a request asked for ("rstar" or "model"), or the server's own choice, rendering with
        the request's `chat_template_kwargs`."""
        if kind is None:
            template = self.template
        elif kind in self.templates:
            template = self.templates[kind]
        else:
            try:
                template = self.templates[kind] = choose_template(self.engine.tokenizer, min(self.model_names), kind)
            except ValueError as exc:  # a model without a template of its own
                raise APIError(400, str(exc), "chat_template") from exc
        if not variables:
            return template
        try:
            variant = template.with_variables(variables)
        except ValueError as exc:
            raise APIError(400, str(exc), "chat_template_kwargs") from exc
        # Keyed by what the variant renders with: variables the template does not read make no new entry.
        key = (kind, repr(variant.variables))
        if key in self.templates:
            return self.templates[key]
        if len(self.templates) < MAX_CACHED_TEMPLATES:  # clients choose the values: the cache must stay bounded
            self.templates[key] = variant
        return variant

    def check_model(self, name: str) -> None:
        if name not in self.model_names:
            raise APIError(404, f"The model `{name}` does not exist. Available: {', '.join(sorted(self.model_names))}.", "model", "model_not_found")

    def store_requested(self, store: bool | None) -> bool:
        return self.store is not None and (self.settings.store_conversations if store is None else store)


class ServingBase:
    """The base of the endpoint services: what a request goes through whatever its wire shape."""

    def __init__(self, serving: Serving):
        self.serving = serving

    def context_room(self, prompt_len: int, max_tokens: int | None) -> int:
        """Tokens the context window leaves after the prompt; APIError 400 when the prompt, or the prompt plus
        the completion tokens asked for, does not fit."""
        limit = self.serving.engine.max_model_len
        room = limit - prompt_len
        if room <= 0 or (max_tokens is not None and max_tokens > room):
            extra = f" plus {max_tokens} completion tokens" if max_tokens else ""
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{prompt_len} input tokens{extra}. Please reduce the length of the messages or the completion.",
                "messages",
                "context_length_exceeded",
            )
        return room

    async def admitted_stream(self, slots: int, events: AsyncIterator[str]) -> AdmittedStream:
        """Take the stream's admission slots before its response starts (a full server answers 429, not a
        broken stream); the returned stream gives them back when it ends or is closed."""
        await self.serving.admission.acquire(slots)
        return AdmittedStream(self.serving.admission, slots, events)

    async def off_loop(self, work: Callable[[], T]) -> T:
        """`work` (rendering and tokenizing a prompt) on the render threads, so the event loop goes on serving
        every other request and /health meanwhile. RenderTimeout once it took api.render_timeout_s, waiting for
        a thread included; a render in the server's own Jinja environment also stops itself then."""
        timeout = self.serving.settings.api.render_timeout_s
        future = asyncio.get_running_loop().run_in_executor(self.serving.renderer, _within_deadline, work, timeout)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise RenderTimeout(f"rendering took over {timeout:g} s") from None

    def guarded(self, events: AsyncIterator[T], generated: Callable[[], bool]) -> AsyncIterator[T]:
        """A request's generation events, streamed or whole: until the server's request timeout counted from
        now (then RequestTimeout, 504), and with input the engine refuses before anything was `generated()`
        answered as the client's 400."""
        timeout = self.serving.settings.api.request_timeout_s
        return with_deadline(refusals_as_client_errors(events, generated), timeout)

    def decoded_logprobs(self, delta: TokenDelta) -> list[DecodedLogprob]:
        return decode_logprobs(self.serving.engine.tokenizer.decode, delta)


def _within_deadline(work: Callable[[], T], timeout_s: float) -> T:
    with render_deadline(timeout_s):
        return work()


def render_timeout_error(param: str) -> APIError:
    limit = "the server's time limit (setting api.render_timeout_s)"
    return APIError(400, f"the prompt did not render and tokenize within {limit}", param, "render_timeout")


def per_choice(options: SamplingOptions, n: int) -> list[SamplingOptions]:
    """One SamplingOptions per choice. With a seed, choice i samples with seed + i, so n > 1 gives n
    different but reproducible samples."""
    return [options if options.seed is None else dataclasses.replace(options, seed=options.seed + choice) for choice in range(n)]


@dataclass(frozen=True)
class DecodedLogprob:
    """One sampled token's logprob with its text, and the top alternatives best first, as text."""

    token: str
    logprob: float
    top: list[tuple[str, float]]


def decode_logprobs(decode: Callable[[list[int]], str], delta: TokenDelta) -> list[DecodedLogprob]:
    """The logprobs an engine delta carries, each token decoded on its own (as OpenAI lists them); empty
    when the delta has none."""
    if delta.logprobs is None:
        return []
    tops = delta.top_logprobs or [{}] * len(delta.token_ids)
    return [
        DecodedLogprob(decode([token_id]), logprob, [(decode([t]), lp) for t, lp in sorted(top.items(), key=lambda kv: -kv[1])])
        for token_id, logprob, top in zip(delta.token_ids, delta.logprobs, tops)
    ]


def sse(data: str, event: str | None = None) -> str:
    """One server-sent event: `data` (a JSON text), named by `event` where the wire shape names them."""
    return (f"event: {event}\n" if event else "") + f"data: {data}\n\n"


async def refusals_as_client_errors(events: AsyncIterator[T], generated: Callable[[], bool]) -> AsyncIterator[T]:
    """Pass `events` through, turning a ValueError raised before anything was `generated()` into a 400.

    vLLM validates a request inside `generate`, before its first output, and raises ValueError for input it
    refuses (token ids, lengths, sampling values): that is the client's input, not a server failure. Once
    tokens came out, a ValueError is the server's own and passes as it is.
    """
    async with contextlib.aclosing(events):
        try:
            async for item in events:
                yield item
        except ValueError as exc:
            if generated():
                raise
            raise APIError(400, f"the engine refused the request: {exc}", code="invalid_request") from exc


async def merge(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several event streams as their events arrive, tagged with their index.

    Closing the merged iterator cancels the pumps, which closes every stream. The queue holds at most a
    few events per stream: a pump waits while its events are not taken.
    """
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as stream:
            async for event in stream:
                yield 0, event
        return
    queue: asyncio.Queue = asyncio.Queue(maxsize=len(streams))
    done = object()

    async def pump(index: int, stream: AsyncIterator) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for event in stream:
                    await queue.put((index, event))
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put((index, exc))
            return
        await queue.put((index, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def request_messages(messages: Sequence[Any]) -> list[dict]:
    """Pydantic chat messages as the plain dicts the template and the loop take (unset fields left out)."""
    return [message.model_dump(exclude_none=True) for message in messages]
