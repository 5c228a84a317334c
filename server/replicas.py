"""Engine replicas behind one router: N engines serving as one `TokenEngine`.

`ReplicatedEngine` sends each generation to the replica `Router.choose` picks from what it knows: requests in
flight per replica (counted here), KV room (each engine's free KV from its stats, polled in the background, less
the uncached prompt tokens sent since the sample and the output its generations in flight may still write) and
which sequences each replica has seen. When every replica is full, requests wait here, not inside one engine.

A replica that dies (its actor is gone, or its engine reports itself failed) is taken out and its prefixes
forgotten; its generations that have streamed nothing yet go to another replica, those that have streamed fail
with EngineFailed naming it (the client already holds part of an answer another engine would not continue).
Then a new replica takes its place, with the latest reloaded weights, and rejoins once it has started.

`ReplicatedEngine` drives replicas through the small `Replica` interface: in service each is a Ray actor
hosting one `VllmEngine` (`ray_replicas.py`, which also starts them); unit tests use in-process ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rstar.server.engine import EngineFailed, EngineStats, SamplingOptions, TokenDelta
from rstar.server.metrics import merge_replica_metrics
from rstar.server.routing import NoHealthyReplica, ReplicaState, Router

log = logging.getLogger("rstar.replicas")


class ReplicaDied(RuntimeError):
    """The replica's process is gone (its actor died or was killed); nothing sent to it will finish."""


@dataclass(frozen=True)
class ReplicaInfo:
    """What a started replica reports about its engine."""

    max_model_len: int
    dtype: str
    sleep_unavailable: str | None = None  # why its engine cannot sleep (TokenEngine.sleep_unavailable), or None


class Replica(Protocol):
    """One engine replica as `ReplicatedEngine` drives it. Every call raises ReplicaDied once its process is gone."""

    name: str  # unique per replica started (a restart gets a new one); the Ray actor's name

    async def start(self) -> ReplicaInfo: ...

    def generate(self, prompt_ids: Sequence[int], options: SamplingOptions, request_id: str) -> AsyncIterator[TokenDelta]: ...

    async def abort(self, request_id: str) -> None: ...

    async def stats(self) -> EngineStats: ...

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]: ...

    async def reload_weights(self, weights_dir: str) -> None: ...

    async def load_adapter(self, adapter_dir: str | None) -> None: ...

    async def sleep(self) -> None: ...

    async def wake_up(self) -> None: ...

    async def reset_prefix_cache(self) -> None: ...

    async def prometheus_text(self) -> str:
        """Its process's Prometheus metrics (vLLM's engine metrics among them), as text; "" when that process is
        this one, whose registry /metrics serves already."""
        ...

    async def shutdown(self) -> None: ...


ReplicaFactory = Callable[[int], Replica]  # a new, unstarted replica for slot i (at start, and after each loss)


# --- the replicated engine ----------------------------------------------------------------------------------

# A replica's loss: its process is gone, or its engine says it cannot serve (a dead EngineCore, a failed reload).
REPLICA_LOST = (ReplicaDied, EngineFailed)


@dataclass
class ReplicaSlot:
    """One replica's place behind the router; a restart puts a new replica in the same slot."""

    replica: Replica
    healthy: bool = False
    restarts: int = 0
    in_flight: int = 0  # generations dispatched here and not finished
    stats: EngineStats | None = None  # the latest sample
    sent_tokens: int = 0  # uncached prompt tokens dispatched since that sample (not yet in its KV usage)
    reserved_tokens: int = 0  # tokens the generations in flight here may still write (their max_tokens, less output)
    failure: str | None = None  # why it is out, while it is
    epoch: int = 0  # bumped at each loss, so work from before the loss does not count against the new replica
    weight_version: int = 0  # the router's weight version this replica loaded last (0: the weights it started with)

    def kv_free_tokens(self) -> int:
        if self.stats is None:
            return 0
        # vLLM samples KV usage at each engine step; an idle engine keeps its last busy sample, so idle means empty.
        usage = self.stats.kv_cache_usage if self.stats.unfinished else 0.0
        return int(self.stats.kv_capacity_tokens * (1.0 - usage)) - self.sent_tokens - self.reserved_tokens

    def state(self) -> ReplicaState:
        return ReplicaState(healthy=self.healthy, in_flight=self.in_flight, kv_free_tokens=self.kv_free_tokens())

    def report(self, index: int) -> dict:
        stats = self.stats
        return {
            "index": index,
            "name": self.replica.name,
            "healthy": self.healthy,
            "restarts": self.restarts,
            "in_flight": self.in_flight,
            "kv_cache_usage": stats.kv_cache_usage if stats else None,
            "kv_free_tokens": self.kv_free_tokens() if stats else None,
            "kv_capacity_tokens": stats.kv_capacity_tokens if stats else None,
            "weight_version": self.weight_version,
            "failure": self.failure,
        }


@dataclass
class Lease:
    """A dispatch: which slot, on which replica, in which epoch of that slot."""

    index: int
    replica: Replica
    epoch: int
    reserved_tokens: int = 0  # what this generation may still write, counted in its slot's reserved_tokens

    def wrote(self, slot: "ReplicaSlot", tokens: int) -> None:
        """Output arrived: that much of the reservation is now real KV usage (the next stats sample shows it)."""
        tokens = min(tokens, self.reserved_tokens)
        self.reserved_tokens -= tokens
        if slot.epoch == self.epoch:
            slot.reserved_tokens -= tokens


@dataclass
class Served:
    """What every replica serves: the whole weights last reloaded and the adapter on them (None: as started)."""

    weights_dir: str | None = None
    adapter_dir: str | None = None
    version: int = 0  # the router's weight version this is


@dataclass
class ReplicatedEngine:
    """N replicas behind a `Router`, as one TokenEngine. Create with `await ReplicatedEngine.start(...)`."""

    new_replica: ReplicaFactory
    router: Router
    tokenizer: Any
    model_name: str
    model_path: str = ""
    max_model_len: int = 0
    dtype: str = ""
    weight_version: int = 0
    stats_interval_s: float = 0.25
    restart_delay_s: float = 1.0  # first wait after a failed restart; doubles up to 32x
    _slots: list[ReplicaSlot] = field(default_factory=list)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _waiting: int = 0  # requests waiting at the router for a replica with room
    _placement: dict[str, int] = field(default_factory=dict)  # request id -> slot, for abort
    _serving: "Served" = field(default_factory=lambda: Served())  # what every replica serves, which a restarted one loads too
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _closed: bool = False
    _sleep_unavailable: str | None = None  # why the replicas cannot sleep, from what they reported at start
    _asleep: bool = False  # between sleep and wake_up: a replica that restarts meanwhile sleeps too
    on_shutdown: Callable[[], Awaitable[None]] | None = None  # releases what the replicas ran on (the Ray connection)

    @classmethod
    async def start(cls, new_replica: ReplicaFactory, router: Router, tokenizer: Any, model_name: str, model_path: str = "", **options: Any) -> "ReplicatedEngine":
        engine = cls(new_replica, router, tokenizer, model_name, model_path, **options)
        engine._slots = [ReplicaSlot(new_replica(i)) for i in range(router.replicas)]
        try:
            infos = await asyncio.gather(*(slot.replica.start() for slot in engine._slots))
        except BaseException:
            await asyncio.gather(*(slot.replica.shutdown() for slot in engine._slots), return_exceptions=True)
            raise
        engine.max_model_len = min(info.max_model_len for info in infos)
        engine.dtype = infos[0].dtype
        engine._sleep_unavailable = next((f"replica {i}: {info.sleep_unavailable}" for i, info in enumerate(infos) if info.sleep_unavailable), None)
        for slot in engine._slots:
            slot.healthy = True
        await asyncio.gather(*(engine._sample(i) for i in range(router.replicas)))
        engine._spawn(engine._poll_stats())
        log.info("%d engine replicas up, routing %s", router.replicas, router.policy)
        return engine

    # --- dispatch --------------------------------------------------------------------------------------

    async def _acquire(self, prompt_ids: Sequence[int], max_tokens: int) -> Lease:
        """Wait until the router picks a replica with room, and count the request there."""
        async with self._changed:
            while (index := self._choose(prompt_ids, max_tokens)) is None:
                self._waiting += 1
                try:
                    await self._changed.wait()
                finally:
                    self._waiting -= 1
            slot = self._slots[index]
            slot.in_flight += 1
            slot.sent_tokens += self.router.uncached_tokens(index, prompt_ids)
            slot.reserved_tokens += max_tokens
        self.router.remember(index, prompt_ids)
        return Lease(index, slot.replica, slot.epoch, max_tokens)

    def _choose(self, prompt_ids: Sequence[int], max_tokens: int) -> int | None:
        try:
            return self.router.choose(prompt_ids, [slot.state() for slot in self._slots], max_tokens)
        except NoHealthyReplica:
            down = "; ".join(f"replica {i}: {slot.failure or 'starting'}" for i, slot in enumerate(self._slots))
            raise EngineFailed(f"no engine replica is healthy ({down}); they are restarting") from None

    async def _release(self, lease: Lease) -> None:
        slot = self._slots[lease.index]
        lease.wrote(slot, lease.reserved_tokens)
        if slot.epoch == lease.epoch:
            slot.in_flight -= 1
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions, request_id: str | None = None) -> AsyncIterator[TokenDelta]:
        """Stream one sequence from the replica the router picks; retried elsewhere if that replica is lost
        before this stream yielded anything."""
        request_id = request_id or uuid.uuid4().hex
        while True:
            lease = await self._acquire(prompt_ids, options.max_tokens)
            self._placement[request_id] = lease.index
            output: list[int] = []
            streamed = False
            try:
                async with contextlib.aclosing(lease.replica.generate(prompt_ids, options, request_id)) as stream:
                    async for delta in stream:
                        streamed = True
                        output.extend(delta.token_ids)
                        lease.wrote(self._slots[lease.index], len(delta.token_ids))
                        yield delta
                self.router.remember(lease.index, [*prompt_ids, *output])
                return
            except REPLICA_LOST as exc:
                await self._lose(lease, exc)
                if streamed:
                    raise EngineFailed(
                        f"engine replica {lease.index} failed after streaming {len(output)} tokens of this answer ({exc}); send the request again"
                    ) from None
                log.warning("engine replica %d lost before request %s streamed; sending it to another replica", lease.index, request_id)
            finally:
                self._placement.pop(request_id, None)
                await self._release(lease)

    async def abort(self, request_id: str) -> None:
        index = self._placement.get(request_id)
        if index is not None:
            with contextlib.suppress(*REPLICA_LOST):
                await self._slots[index].replica.abort(request_id)

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        while True:
            lease = await self._acquire(token_ids, 1)
            try:
                return await lease.replica.prompt_logprobs(token_ids)
            except REPLICA_LOST as exc:
                await self._lose(lease, exc)
            finally:
                await self._release(lease)

    # --- health ----------------------------------------------------------------------------------------

    async def _lose(self, lease: Lease, reason: BaseException) -> None:
        """Take the lease's replica out (once, whoever notices first) and start its replacement."""
        slot = self._slots[lease.index]
        if slot.epoch != lease.epoch or self._closed:
            return
        log.error("engine replica %d lost (%s); restarting it", lease.index, reason)
        slot.healthy, slot.failure, slot.stats = False, f"{type(reason).__name__}: {reason}", None
        slot.in_flight = slot.sent_tokens = slot.reserved_tokens = 0
        slot.epoch += 1
        self.router.forget(lease.index)
        self._spawn(self._restart(lease.index, lease.replica))
        await self._notify()

    async def _restart(self, index: int, lost: Replica) -> None:
        with contextlib.suppress(Exception):
            await lost.shutdown()
        delay = self.restart_delay_s
        while not self._closed:
            replica = self.new_replica(index)
            try:
                await replica.start()
                served = self._serving
                if served.weights_dir is not None:
                    await replica.reload_weights(served.weights_dir)
                if served.adapter_dir is not None:
                    await replica.load_adapter(served.adapter_dir)
                asleep = False
                while asleep != self._asleep:  # the others sleep for a colocated trainer's update: so does this one
                    asleep = not asleep
                    await (replica.sleep() if asleep else replica.wake_up())
            except Exception as exc:
                log.error("engine replica %d did not restart (%s); trying again in %.0f s", index, exc, delay)
                with contextlib.suppress(Exception):
                    await replica.shutdown()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.restart_delay_s * 32)
                continue
            if self._closed:
                await replica.shutdown()
                return
            slot = self._slots[index]
            slot.replica, slot.healthy, slot.failure = replica, True, None
            slot.weight_version = served.version
            slot.restarts += 1
            await self._sample(index)
            log.info("engine replica %d is back (restart %d)", index, slot.restarts)
            await self._notify()
            return

    async def _sample(self, index: int) -> None:
        slot = self._slots[index]
        lease = Lease(index, slot.replica, slot.epoch)
        sent_before = slot.sent_tokens
        try:
            stats = await asyncio.wait_for(slot.replica.stats(), timeout=max(5.0, 10 * self.stats_interval_s))
        except asyncio.TimeoutError:
            return  # busy: keep the previous sample
        except ReplicaDied as exc:
            await self._lose(lease, exc)
            return
        if stats.failed:
            await self._lose(lease, EngineFailed(stats.failed))
        elif slot.epoch == lease.epoch:
            slot.stats = stats
            slot.sent_tokens -= sent_before  # what was sent while the sample was taken may not be in it yet

    async def _poll_stats(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.stats_interval_s)
            await asyncio.gather(*(self._sample(i) for i, slot in enumerate(self._slots) if slot.healthy))
            await self._notify()  # KV room may have freed up for waiting requests

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def replicas(self) -> list[dict]:
        """Each replica's health and load, for /health."""
        return [slot.report(i) for i, slot in enumerate(self._slots)]

    async def replica_metrics(self, timeout_s: float = 5.0) -> bytes:
        """vLLM's metrics of every healthy replica, labelled by replica, for /metrics; a replica that is down or
        does not answer in time is left out of this scrape."""

        async def scrape(slot: ReplicaSlot) -> str | None:
            if not slot.healthy:
                return None
            try:
                return await asyncio.wait_for(slot.replica.prometheus_text(), timeout_s)
            except (*REPLICA_LOST, asyncio.TimeoutError):
                return None

        return merge_replica_metrics(await asyncio.gather(*(scrape(slot) for slot in self._slots)))

    def stats(self) -> EngineStats:
        sampled = [slot.stats for slot in self._slots if slot.healthy and slot.stats is not None]
        capacity = sum(s.kv_capacity_tokens for s in sampled)
        used = sum(s.kv_capacity_tokens * s.kv_cache_usage for s in sampled)
        healthy = sum(slot.healthy for slot in self._slots)
        return EngineStats(
            unfinished=sum(s.unfinished for s in sampled) + self._waiting,
            running=sum(s.running for s in sampled),
            waiting=sum(s.waiting for s in sampled) + self._waiting,
            kv_cache_usage=used / capacity if capacity else 0.0,
            weight_version=self.weight_version,
            kv_capacity_tokens=capacity,
            failed=None if healthy else "no engine replica is healthy: " + "; ".join(f"replica {i}: {s.failure}" for i, s in enumerate(self._slots)),
        )

    # --- every replica ---------------------------------------------------------------------------------

    async def _on_every_replica(self, call: Callable[[Replica], Awaitable[Any]], doing: str) -> dict[int, Any]:
        """`call` on every healthy replica at once: each one's result by slot. A replica lost meanwhile is taken out
        (and restarts); any other error is raised. EngineFailed when no replica is healthy to do it."""
        leases = [Lease(i, slot.replica, slot.epoch) for i, slot in enumerate(self._slots) if slot.healthy]
        if not leases:
            raise EngineFailed(f"no engine replica is healthy to {doing}")
        results = await asyncio.gather(*(call(lease.replica) for lease in leases), return_exceptions=True)
        done = {}
        for lease, result in zip(leases, results):
            if isinstance(result, REPLICA_LOST):
                await self._lose(lease, result)
            elif isinstance(result, BaseException):
                raise result
            elif self._slots[lease.index].epoch == lease.epoch:
                done[lease.index] = result
        return done

    @property
    def sleep_unavailable(self) -> str | None:
        return self._sleep_unavailable

    async def sleep(self) -> None:
        """Every replica asleep for a colocated trainer's update; one that restarts meanwhile sleeps once up."""
        self._asleep = True
        await self._on_every_replica(lambda replica: replica.sleep(), "sleep; they sleep when they restart")

    async def wake_up(self) -> None:
        self._asleep = False
        await self._on_every_replica(lambda replica: replica.wake_up(), "wake up; they start awake")

    async def reload_weights(self, weights_dir: str | Path) -> None:
        """New weights on every replica; one that fails to load is lost and restarts with them. Replicas restarting
        meanwhile load them once up, so every replica serving afterwards runs `weight_version`."""
        weights_dir = Path(weights_dir)
        if not any(weights_dir.glob("*.safetensors")):
            raise FileNotFoundError(f"no *.safetensors files in {weights_dir}")
        await self._serve(Served(str(weights_dir), self._serving.adapter_dir), lambda replica: replica.reload_weights(str(weights_dir)), "reload weights into")
        for i in range(self.router.replicas):
            self.router.forget(i)  # their prefix caches were reset with the new weights

    async def load_adapter(self, adapter_dir: str | Path | None) -> None:
        """Base + the LoRA adapter in `adapter_dir` on every replica (None: the base alone), as `reload_weights`
        does for whole weights: a replica restarting meanwhile loads it once up."""
        adapter = str(adapter_dir) if adapter_dir is not None else None
        await self._serve(Served(self._serving.weights_dir, adapter), lambda replica: replica.load_adapter(adapter), "load the adapter into")

    async def _serve(self, served: "Served", load: Callable[[Replica], Awaitable[None]], doing: str) -> None:
        """`load` on every replica, which then serves `served` as the next weight version."""
        served.version = self.weight_version + 1
        self._serving = served
        loaded = await self._on_every_replica(load, f"{doing}; they load it when they restart")
        for index in loaded:
            self._slots[index].weight_version = served.version
        self.weight_version = served.version

    async def replica_prompt_logprobs(self, token_ids: Sequence[int]) -> dict[int, list[float]]:
        """Every healthy replica's `prompt_logprobs` of `token_ids`, by slot: the weight-sync probe checks each
        replica, where `prompt_logprobs` asks the one the router picks."""
        return await self._on_every_replica(lambda replica: replica.prompt_logprobs(token_ids), "probe; they are restarting")

    async def reset_prefix_cache(self) -> None:
        await asyncio.gather(*(slot.replica.reset_prefix_cache() for slot in self._slots if slot.healthy))
        for i in range(self.router.replicas):
            self.router.forget(i)

    async def shutdown(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(slot.replica.shutdown() for slot in self._slots), return_exceptions=True)
        release, self.on_shutdown = self.on_shutdown, None  # once, however often shutdown is called
        if release is not None:
            await release()
