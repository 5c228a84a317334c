"""The engine asleep while the trainer updates: trainer and engine colocated on the same devices.

The release's hybrid engine (verl's, `rollout.free_cache_engine`) frees the rollout engine's memory for the
update: the weights and KV cache of a 14B engine are most of a GPU that the sharded trainer also needs. Here the
engine sleeps (vLLM sleep mode, level 1) after the step's rollouts, the trainer updates, and the engine wakes
before the weight sync, so the new weights load into woken memory and the next rollouts find a fresh KV cache:

    rollout -> reward -> sleep -> update -> wake -> sync + probe -> (next step) rollout

Engine replicas sleep and wake together (`ReplicatedEngine.sleep`; one restarting meanwhile sleeps once up). An
engine that cannot sleep (vLLM has no sleep mode on CPU; an engine started without it; the engine of a run started
over the API, which answers requests all along) stays awake, and the run says so once, at its start.
"""

from __future__ import annotations

import contextlib
import logging

from rstar.server.engine import TokenEngine

log = logging.getLogger("rstar.rl")


class EngineSleep:
    def __init__(self, engine: TokenEngine, wanted: bool):
        self.engine = engine
        reason = engine.sleep_unavailable if wanted else None
        self.active = wanted and reason is None
        if reason is not None:
            log.warning("sleep_engine: %s; the engine keeps its weights and KV cache in memory while the trainer updates", reason)

    @contextlib.asynccontextmanager
    async def asleep(self):
        """The engine asleep inside the block, awake again after it, also when the update fails."""
        if not self.active:
            yield
            return
        await self.engine.sleep()
        try:
            yield
        finally:
            await self.engine.wake_up()
