"""`/v1/completions` (plain generation from text or token ids, no template, no tool loop) and the
`/detokenize` utility, both with the served model's tokenizer (`/tokenize` renders as chat does: serving_chat)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from rstar.server.chat_template import RenderTimeout
from rstar.server.engine import SamplingOptions, TokenDelta
from rstar.server.errors import APIError
from rstar.server.limits import AdmittedStream
from rstar.server.schemas import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    DetokenizeRequest,
    Usage,
    new_id,
)
from rstar.server.serving_base import SSE_DONE, Serving, ServingBase, merge, per_choice, render_timeout_error, sse


@dataclass
class _Choice:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: CompletionLogprobs = field(default_factory=CompletionLogprobs)
    finish_reason: str | None = None


class CompletionService(ServingBase):
    async def prepare(self, request: CompletionRequest) -> tuple[list[int], list[SamplingOptions]]:
        serving = self.serving
        serving.check_model(request.model)
        tokenizer = serving.engine.tokenizer
        if isinstance(request.prompt, list):
            prompt_ids = check_token_ids(serving, request.prompt, "prompt")
        else:
            try:
                prompt_ids = await self.off_loop(lambda: tokenizer.encode(request.prompt))
            except RenderTimeout:
                raise render_timeout_error("prompt") from None
        room = self.context_room(len(prompt_ids), request.max_tokens)
        return prompt_ids, per_choice(request.sampling_options(request.max_tokens or room, serving.sampling_defaults), request.n)

    def _generations(self, prompt_ids: list[int], options: list[SamplingOptions], request_id: str, choices: list[_Choice]) -> AsyncIterator[tuple[int, TokenDelta]]:
        """Every choice's generation, merged, until the request's deadline."""
        engine = self.serving.engine
        merged = merge([engine.generate(prompt_ids, opts, f"{request_id}-{i}") for i, opts in enumerate(options)])
        return self.guarded(merged, generated=lambda: any(choice.token_ids for choice in choices))

    def _accumulate(self, choice: _Choice, delta: TokenDelta, received_at: float) -> str:
        if not choice.token_ids and delta.token_ids:
            self.serving.metrics.time_to_first_token.observe(time.monotonic() - received_at)
        offset = len(choice.text)
        choice.text += delta.text
        choice.token_ids += delta.token_ids
        for entry in self.decoded_logprobs(delta):
            choice.logprobs.tokens.append(entry.token)
            choice.logprobs.token_logprobs.append(entry.logprob)
            choice.logprobs.top_logprobs.append(dict(entry.top))
            choice.logprobs.text_offset.append(offset)
            offset += len(entry.token)
        if delta.finished:
            choice.finish_reason = delta.finish_reason
        return delta.text

    def _usage(self, prompt_ids: list[int], choices: list[_Choice]) -> Usage:
        generated = sum(len(c.token_ids) for c in choices)
        self.serving.metrics.prompt_tokens.inc(len(prompt_ids))
        self.serving.metrics.generation_tokens.inc(generated)
        return Usage(prompt_tokens=len(prompt_ids), completion_tokens=generated, total_tokens=len(prompt_ids) + generated)

    async def complete(self, request: CompletionRequest, received_at: float) -> Completion:
        prompt_ids, options = await self.prepare(request)
        completion_id = new_id("cmpl")
        choices = [_Choice(i) for i in range(request.n)]
        generations = self._generations(prompt_ids, options, completion_id, choices)
        async with self.serving.admission.slots(request.n), contextlib.aclosing(generations):
            async for index, delta in generations:
                self._accumulate(choices[index], delta, received_at)
        return Completion(
            id=completion_id,
            model=request.model,
            choices=[self._wire_choice(request, c, c.text, final=True) for c in choices],
            usage=self._usage(prompt_ids, choices),
            prompt_token_ids=prompt_ids if request.return_token_ids else None,
        )

    def _wire_choice(self, request: CompletionRequest, choice: _Choice, text: str, final: bool) -> CompletionChoice:
        return CompletionChoice(
            index=choice.index,
            text=text,
            finish_reason=choice.finish_reason if final else None,
            logprobs=choice.logprobs if request.logprobs is not None and final else None,
            token_ids=choice.token_ids if request.return_token_ids and final else None,
        )

    async def stream(self, request: CompletionRequest, received_at: float) -> AdmittedStream:
        prompt_ids, options = await self.prepare(request)
        return await self.admitted_stream(request.n, self._sse(request, prompt_ids, options, received_at))

    async def _sse(self, request: CompletionRequest, prompt_ids: list[int], options: list[SamplingOptions], received_at: float) -> AsyncIterator[str]:
        completion_id = new_id("cmpl")
        choices = [_Choice(i) for i in range(request.n)]

        def event(completion: Completion) -> str:
            return sse(completion.model_dump_json(exclude_none=True))

        generations = self._generations(prompt_ids, options, completion_id, choices)
        async with contextlib.aclosing(generations):  # closing aborts the generations
            async for index, delta in generations:
                choice = choices[index]
                text = self._accumulate(choice, delta, received_at)
                # Logprobs and token ids travel once, with the choice's last chunk.
                yield event(Completion(id=completion_id, model=request.model, choices=[self._wire_choice(request, choice, text, delta.finished)]))
        usage = self._usage(prompt_ids, choices)
        if request.stream_options and request.stream_options.include_usage:
            yield event(Completion(id=completion_id, model=request.model, choices=[], usage=usage))
        yield SSE_DONE


def detokenize(serving: Serving, request: DetokenizeRequest) -> dict:
    if request.model is not None:
        serving.check_model(request.model)
    return {"prompt": serving.engine.tokenizer.decode(check_token_ids(serving, request.tokens, "tokens"))}


def check_token_ids(serving: Serving, token_ids: list[int], param: str) -> list[int]:
    """Token ids a client sent, checked against the vocabulary here: the engine would refuse an unknown id
    deep inside, as an internal error, when it is the client's (400)."""
    vocabulary = len(serving.engine.tokenizer)
    if bad := [token for token in token_ids if not 0 <= token < vocabulary]:
        raise APIError(400, f"token ids must be in [0, {vocabulary}); got {bad[0]}", param)
    return list(token_ids)
