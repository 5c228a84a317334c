"""A sandbox spread over a Ray cluster: one zygote pool per node, behind the `SandboxClient` interface.

The pool joins this process's Ray (`rstar.ray_cluster`: the cluster `settings.ray_address` names, or a local
one). Each alive node gets
`ray_pools_per_node` actors pinned to it (NodeAffinity); each actor owns a `SandboxPool`. Calls go to the
actor with the fewest calls in flight; a session sticks to the actor that opened it. The actors reserve no
Ray CPUs: their cells run in the zygote's processes, which Ray does not schedule.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rstar import ray_cluster

from .pool import SandboxPool
from .schemas import RunRequest, RunResult, VerifyResult
from .settings import SandboxSettings
from .verify import RewardRule

log = logging.getLogger("rstar.sandbox")
UID_STRIDE = 1000


class NodePool:
    """Runs inside a Ray actor on one node."""

    def __init__(self, settings: dict) -> None:
        self.pool = SandboxPool(SandboxSettings(**settings))

    async def start(self) -> dict:
        await self.pool.start()
        return self.pool.health()

    async def run(self, request: Any) -> dict:
        return (await self.pool.run(request)).model_dump()

    async def run_batch(self, requests: list) -> list[dict]:
        return [r.model_dump() for r in await self.pool.run_batch(requests)]

    async def verify(self, response: str, gold: str, timeout_s: float | None, rule: RewardRule = "boxed") -> dict:
        return (await self.pool.verify(response, gold, timeout_s, rule)).model_dump()

    async def close_session(self, session_id: str) -> None:
        await self.pool.close_session(session_id)

    async def health(self) -> dict:
        return self.pool.health()

    async def processes(self) -> list[dict]:
        return await self.pool.processes()

    async def close(self) -> None:
        await self.pool.close()


class RayPool:
    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self.actors: list[Any] = []
        self.inflight: list[int] = []
        self.sessions: dict[str, int] = {}
        self._joined = False

    async def start(self) -> "RayPool":
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        await ray_cluster.join(self.settings.ray_address)
        self._joined = True
        actor_cls = ray.remote(num_cpus=0, max_concurrency=10_000)(NodePool)
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        for node in nodes:
            for k in range(self.settings.ray_pools_per_node):
                strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
                # Pools on one node get disjoint cell uids: RLIMIT_NPROC counts per uid across the whole host.
                pool_settings = self.settings.model_dump() | {"uid_base": self.settings.uid_base + k * UID_STRIDE}
                self.actors.append(actor_cls.options(scheduling_strategy=strategy).remote(pool_settings))
        self.inflight = [0] * len(self.actors)
        # Start every pool now so a missing isolation layer on any node fails here, loudly.
        await asyncio.gather(*(actor.start.remote() for actor in self.actors))
        log.info("RayPool: %d sandbox pools on %d nodes", len(self.actors), len(nodes))
        return self

    async def __aenter__(self) -> "RayPool":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _pick(self, session_id: str | None = None) -> int:
        if session_id is not None and session_id in self.sessions:
            return self.sessions[session_id]
        index = min(range(len(self.actors)), key=self.inflight.__getitem__)
        if session_id is not None:
            self.sessions[session_id] = index
        return index

    async def _call(self, index: int, method: str, *args: Any) -> Any:
        self.inflight[index] += 1
        try:
            return await getattr(self.actors[index], method).remote(*args)
        finally:
            self.inflight[index] -= 1

    async def run(self, request: RunRequest | dict) -> RunResult:
        payload = request.model_dump() if isinstance(request, RunRequest) else request
        # A container's cells share one interpreter too: they stick to one actor as a session's do.
        session = (payload.get("session_id") or payload.get("container_id")) if isinstance(payload, dict) else None
        return RunResult.model_validate(await self._call(self._pick(session if isinstance(session, str) else None),
                                                         "run", payload))

    async def run_batch(self, requests: list) -> list[RunResult]:
        return list(await asyncio.gather(*(self.run(r) for r in requests)))

    async def verify(self, response: str, gold: str, timeout_s: float | None = None, rule: RewardRule = "boxed") -> VerifyResult:
        return VerifyResult.model_validate(await self._call(self._pick(), "verify", response, gold, timeout_s, rule))

    async def close_session(self, session_id: str) -> None:
        index = self.sessions.pop(session_id, None)
        if index is not None:
            await self._call(index, "close_session", session_id)

    async def close_container(self, container_id: str) -> None:
        await self.close_session(container_id)  # its interpreter is the session of its id on the actor it sticks to

    async def health(self) -> dict:
        reports = await asyncio.gather(*(actor.health.remote() for actor in self.actors))
        return {"status": "ok" if all(r["status"] == "ok" for r in reports) else "degraded", "pools": reports}

    async def processes(self) -> list[list[dict]]:
        return list(await asyncio.gather(*(actor.processes.remote() for actor in self.actors)))

    async def close(self) -> None:
        import ray

        if self.actors:
            await asyncio.gather(*(actor.close.remote() for actor in self.actors), return_exceptions=True)
            for actor in self.actors:
                ray.kill(actor)
            self.actors = []
        if self._joined:
            await ray_cluster.leave()
            self._joined = False
