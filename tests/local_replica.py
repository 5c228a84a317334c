"""An in-process replica for unit tests: any TokenEngine behind `ReplicatedEngine`'s Replica interface, which
`kill` turns into a dead actor, so routing and failover run without Ray."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from rstar.server.engine import EngineStats, SamplingOptions, TokenDelta, TokenEngine
from rstar.server.replicas import ReplicaDied, ReplicaInfo


class LocalReplica:
    """Any TokenEngine in this process behind the Replica interface; `kill` makes it behave as a dead actor."""

    def __init__(self, start_engine: Callable[[], Awaitable[TokenEngine]], name: str) -> None:
        self._start_engine = start_engine
        self.name = name
        self.engine: TokenEngine | None = None
        self.killed = False

    def kill(self) -> None:
        """From now on every call, and every stream at its next delta, raises ReplicaDied."""
        self.killed = True

    def _alive(self) -> TokenEngine:
        if self.killed:
            raise ReplicaDied(f"{self.name} was killed")
        return self.engine

    async def start(self) -> ReplicaInfo:
        self.engine = await self._start_engine()
        return ReplicaInfo(max_model_len=self.engine.max_model_len, dtype=getattr(self.engine, "dtype", ""), sleep_unavailable=self.engine.sleep_unavailable)

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions, request_id: str) -> AsyncIterator[TokenDelta]:
        async with contextlib.aclosing(self._alive().generate(prompt_ids, options, request_id)) as stream:
            async for delta in stream:
                self._alive()
                yield delta

    async def abort(self, request_id: str) -> None:
        await self._alive().abort(request_id)

    async def stats(self) -> EngineStats:
        return self._alive().stats()

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        return await self._alive().prompt_logprobs(token_ids)

    async def reload_weights(self, weights_dir: str) -> None:
        await self._alive().reload_weights(weights_dir)

    async def load_adapter(self, adapter_dir: str | None) -> None:
        await self._alive().load_adapter(adapter_dir)

    async def sleep(self) -> None:
        await self._alive().sleep()

    async def wake_up(self) -> None:
        await self._alive().wake_up()

    async def reset_prefix_cache(self) -> None:
        self._alive()

    async def prometheus_text(self) -> str:
        self._alive()
        return ""

    async def shutdown(self) -> None:
        if self.engine is not None and not self.killed:
            await self.engine.shutdown()
