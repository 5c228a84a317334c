"""A TokenEngine that replays scripted replies: the one stand-in for vLLM in unit tests and benchmarks.

It speaks exactly the interface `rstar.server.engine.TokenEngine` defines, with a real tokenizer, and
behaves as the real engine does where callers can tell: a text reply is a whole turn, so it ends with the
turn-end token `<|im_end|>` the model samples (the agent loop keeps a sampled turn end and supplies one
otherwise); max_tokens cuts a reply and the cut one finishes with "length"; text is decoded as the request
asks (special tokens skipped by default); logprobs come only when asked. It records what it was asked and
what was aborted, so tests can check both sides of the boundary.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar.sandbox.tools import PYTHON_TOOL
from rstar.server.engine import EngineStats, SamplingOptions, TokenDelta

TURN_END = "<|im_end|>"


def call(code: str, name: str = PYTHON_TOOL) -> str:
    """A built-in tool call as a model writes it, for scripted turns."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"code": code, "input": ""}}) + "\n</tool_call>"


def scripted_engine(tokenizer, turns: list[str], **options) -> "ScriptedEngine":
    """The scripted engine streaming three tokens per delta, so the loop's parsers see tokens arrive in
    groups as they do from vLLM."""
    return ScriptedEngine(tokenizer, turns, tokens_per_delta=3, **options)


@dataclass
class ScriptedEngine:
    tokenizer: Any
    # Served in order, then the last one repeats. A string is a whole turn (encoded, then the turn end);
    # a list of token ids is played exactly as given, for scripts that need exact token counts.
    replies: list[str | list[int]]
    model_name: str = "scripted"
    max_model_len: int = 2048
    tokens_per_delta: int = 1  # vLLM sometimes streams several tokens in one delta
    token_delay_s: float = 0.0  # > 0 makes streams slow enough to cancel mid-way
    weight_version: int = 0
    prompts: list[list[int]] = field(default_factory=list)
    sampling: list[SamplingOptions] = field(default_factory=list)  # the options of each generate call
    aborted: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    fail_after_tokens: int | None = None  # raise mid-stream, as an engine crash would
    kv_capacity_tokens: int = 0  # reported in stats, for routing by free KV cache
    adapter: str | None = None  # the LoRA adapter dir load_adapter was given last
    sleep_unavailable: str | None = "a scripted engine holds no device memory to free"  # None: sleep and wake_up work
    asleep: bool = False
    closed: bool = False

    def __post_init__(self) -> None:
        self.replies = list(self.replies)  # served replies are popped: the caller's list stays as it was

    def _next_reply_ids(self) -> list[int]:
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if not isinstance(reply, str):
            return list(reply)
        return self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.convert_tokens_to_ids(TURN_END)]

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions, request_id: str | None = None) -> AsyncIterator[TokenDelta]:
        self._awake("generate")
        request_id = request_id or uuid.uuid4().hex
        self.prompts.append(list(prompt_ids))
        self.sampling.append(options)
        reply_ids = self._next_reply_ids()
        finish_reason = "stop" if len(reply_ids) <= options.max_tokens else "length"
        reply_ids = reply_ids[: options.max_tokens]
        self.running.add(request_id)
        finished = False
        try:
            for start in range(0, len(reply_ids), self.tokens_per_delta):
                if self.fail_after_tokens is not None and start >= self.fail_after_tokens:
                    raise RuntimeError("scripted engine failure")
                await asyncio.sleep(self.token_delay_s)  # a real engine yields to the event loop between deltas
                chunk = reply_ids[start : start + self.tokens_per_delta]
                finished = start + self.tokens_per_delta >= len(reply_ids)
                yield TokenDelta(
                    token_ids=chunk,
                    text=self.tokenizer.decode(chunk, skip_special_tokens=options.skip_special_tokens),
                    logprobs=[-0.5] * len(chunk) if options.logprobs is not None else None,
                    top_logprobs=[{token_id: -0.5} for token_id in chunk] if options.logprobs else None,
                    finished=finished,
                    finish_reason=finish_reason if finished else None,
                    num_prompt_tokens=len(prompt_ids),
                )
        finally:
            self.running.discard(request_id)
            if not finished:
                self.aborted.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        running = len(self.running)
        return EngineStats(
            unfinished=running, running=running, waiting=0, kv_cache_usage=0.0, weight_version=self.weight_version, kv_capacity_tokens=self.kv_capacity_tokens
        )

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """A logprob per token after the first that each reload moves (-1 at weight version 0, -2 at 1, ...), so a
        replica left on old weights reads differently."""
        return [-1.0 - self.weight_version] * (len(token_ids) - 1)

    async def replica_prompt_logprobs(self, token_ids: Sequence[int]) -> dict[int, list[float]]:
        return {0: await self.prompt_logprobs(token_ids)}

    async def reload_weights(self, weights_dir: str | Path) -> None:
        self._awake("reload weights")
        self.weight_version += 1

    async def load_adapter(self, adapter_dir: str | Path | None) -> None:
        self._awake("load an adapter")
        self.adapter = str(adapter_dir) if adapter_dir is not None else None
        self.weight_version += 1

    def _awake(self, doing: str) -> None:
        # A real engine asleep holds no weights: a reload would land in freed memory, a generation would wait.
        if self.asleep:
            raise RuntimeError(f"asked to {doing} while asleep")

    async def sleep(self) -> None:
        assert self.sleep_unavailable is None, self.sleep_unavailable
        self.asleep = True

    async def wake_up(self) -> None:
        self.asleep = False

    async def shutdown(self) -> None:
        self.closed = True
