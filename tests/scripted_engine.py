"""A TokenEngine that replays scripted replies: the unit-test stand-in for vLLM.

It speaks exactly the interface `rstar.server.engine.TokenEngine` defines, streams one token per delta with
a real tokenizer, honours max_tokens, and records what it was asked and what was aborted, so tests can
check both sides of the boundary.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar.server.engine import EngineStats, SamplingOptions, TokenDelta


@dataclass
class ScriptedEngine:
    tokenizer: Any
    replies: list[str]  # served in order, then the last one repeats
    model_name: str = "scripted"
    max_model_len: int = 2048
    token_delay_s: float = 0.0  # > 0 makes streams slow enough to cancel mid-way
    weight_version: int = 0
    prompts: list[list[int]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    fail_after_tokens: int | None = None  # raise mid-stream, as an engine crash would
    closed: bool = False

    def _next_reply(self) -> str:
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions, request_id: str | None = None) -> AsyncIterator[TokenDelta]:
        request_id = request_id or uuid.uuid4().hex
        self.prompts.append(list(prompt_ids))
        reply_ids = self.tokenizer.encode(self._next_reply(), add_special_tokens=False)
        stops_on_eos = len(reply_ids) <= options.max_tokens
        reply_ids = reply_ids[: options.max_tokens]
        self.running.add(request_id)
        finished = False
        try:
            for position, token_id in enumerate(reply_ids):
                if self.fail_after_tokens is not None and position == self.fail_after_tokens:
                    raise RuntimeError("scripted engine failure")
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                last = position == len(reply_ids) - 1
                finished = last
                yield TokenDelta(
                    token_ids=[token_id],
                    text=self.tokenizer.decode([token_id]),
                    logprobs=[-0.5] if options.logprobs is not None else None,
                    top_logprobs=[{token_id: -0.5}] if options.logprobs else None,
                    finished=last,
                    finish_reason=("stop" if stops_on_eos else "length") if last else None,
                    num_prompt_tokens=len(prompt_ids),
                )
        finally:
            self.running.discard(request_id)
            if not finished:
                self.aborted.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(unfinished=len(self.running), running=len(self.running), waiting=0, kv_cache_usage=0.0, weight_version=self.weight_version)

    async def reload_weights(self, weights_dir: str | Path) -> None:
        self.weight_version += 1

    async def shutdown(self) -> None:
        self.closed = True
