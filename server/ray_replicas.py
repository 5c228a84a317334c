"""Engine replicas on Ray: each replica a Ray actor hosting one `VllmEngine` (one per GPU, or on CPU a share of
the cores each), placed on a local Ray or on the cluster at `ray_address`, behind one `ReplicatedEngine`.

`start_engine` is where serving and RL get their engine: these replicas when the settings ask for more than
one engine or for a cluster, else the one in-process `VllmEngine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from rstar import ray_cluster
from rstar.config import EngineSettings
from rstar.hardware import usable_cores
from rstar.server.engine import EngineNotInstalled, EngineStats, SamplingOptions, TokenDelta, TokenEngine, VllmEngine
from rstar.server.replicas import Replica, ReplicaDied, ReplicaInfo, ReplicatedEngine
from rstar.server.routing import Router

RAY_NAMESPACE = "rstar"


class RayNotInstalled(EngineNotInstalled):
    """Replicas need Ray, which the `ray` extra installs."""


def require_ray():
    try:
        import ray
    except ImportError as exc:
        raise RayNotInstalled(f"engine replicas run on Ray, which is not installed ({exc}): `bash install.sh cpu,ray` (or gpu,ray)") from exc
    return ray


class EngineActor:
    """Runs inside a Ray actor (async: many generations at once): one VllmEngine, started by `start`."""

    def __init__(self, model_dir: str, settings: dict, served_model_name: str | None, cache_dir: str | None) -> None:
        self._model_dir = model_dir
        self._settings = EngineSettings(**settings)
        self._served_model_name = served_model_name
        self._cache_dir = Path(cache_dir) if cache_dir else None
        self.engine: VllmEngine | None = None

    async def start(self) -> ReplicaInfo:
        self.engine = await VllmEngine.start(self._model_dir, self._settings, self._served_model_name, cache_dir=self._cache_dir)
        return ReplicaInfo(max_model_len=self.engine.max_model_len, dtype=self.engine.dtype, sleep_unavailable=self.engine.sleep_unavailable)

    async def generate(self, prompt_ids: list[int], options: SamplingOptions, request_id: str):
        async with contextlib.aclosing(self.engine.generate(prompt_ids, options, request_id)) as stream:
            async for delta in stream:
                yield delta

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    async def stats(self) -> EngineStats:
        return self.engine.stats()

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        return await self.engine.prompt_logprobs(token_ids)

    async def reload_weights(self, weights_dir: str) -> None:
        await self.engine.reload_weights(weights_dir)

    async def load_adapter(self, adapter_dir: str | None) -> None:
        await self.engine.load_adapter(adapter_dir)

    async def sleep(self) -> None:
        await self.engine.sleep()

    async def wake_up(self) -> None:
        await self.engine.wake_up()

    async def reset_prefix_cache(self) -> None:
        await self.engine.reset_prefix_cache()

    async def prometheus_text(self) -> str:
        from prometheus_client import REGISTRY, generate_latest

        return generate_latest(REGISTRY).decode()

    async def shutdown(self) -> None:
        await self.engine.shutdown()


def _actor_gone_errors() -> tuple[type[BaseException], ...]:
    from ray.exceptions import ActorUnavailableError, RayActorError

    return (RayActorError, ActorUnavailableError)


class RayReplica:
    """A replica as a Ray actor: `start` creates the actor and waits for its engine; a lost actor raises ReplicaDied."""

    def __init__(self, actor_class: Any, actor_options: dict, actor_args: tuple, name: str) -> None:
        self._actor_class = actor_class
        self._actor_options = actor_options
        self._actor_args = actor_args
        self.name = name
        self.actor: Any = None

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self.actor, method).remote(*args)
        except _actor_gone_errors() as exc:
            raise ReplicaDied(f"{self.name}: {type(exc).__name__}") from exc

    async def start(self) -> ReplicaInfo:
        self.actor = self._actor_class.options(**self._actor_options).remote(*self._actor_args)
        return await self._call("start")

    async def generate(self, prompt_ids: Sequence[int], options: SamplingOptions, request_id: str) -> AsyncIterator[TokenDelta]:
        stream = self.actor.generate.options(num_returns="streaming").remote(list(prompt_ids), options, request_id)
        finished = False
        try:
            async for ref in stream:
                delta = await ref
                finished = delta.finished
                yield delta
        except _actor_gone_errors() as exc:
            finished = True  # nothing left there to abort
            raise ReplicaDied(f"{self.name}: {type(exc).__name__}") from exc
        finally:
            if not finished:  # the caller stopped reading: free the engine's slot (fire and forget)
                self.actor.abort.remote(request_id)

    async def abort(self, request_id: str) -> None:
        await self._call("abort", request_id)

    async def stats(self) -> EngineStats:
        return await self._call("stats")

    async def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        return await self._call("prompt_logprobs", list(token_ids))

    async def reload_weights(self, weights_dir: str) -> None:
        await self._call("reload_weights", weights_dir)

    async def load_adapter(self, adapter_dir: str | None) -> None:
        await self._call("load_adapter", adapter_dir)

    async def sleep(self) -> None:
        await self._call("sleep")

    async def wake_up(self) -> None:
        await self._call("wake_up")

    async def reset_prefix_cache(self) -> None:
        await self._call("reset_prefix_cache")

    async def prometheus_text(self) -> str:
        return await self._call("prometheus_text")

    async def shutdown(self) -> None:
        """Stop the engine cleanly if the actor still answers, then end the actor."""
        import ray

        if self.actor is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._call("shutdown"), timeout=30)
        ray.kill(self.actor, no_restart=True)
        self.actor = None


def split_cores(cores: Sequence[int], replicas: int) -> list[str]:
    """VLLM_CPU_OMP_THREADS_BIND for each CPU replica: the cores in even contiguous shares, the first ones one
    core larger when they do not divide evenly."""
    if replicas > len(cores):
        raise ValueError(f"{replicas} CPU replicas need at least {replicas} cores; this machine offers {len(cores)}")
    share, extra = divmod(len(cores), replicas)
    bindings, start = [], 0
    for i in range(replicas):
        part = cores[start : start + share + (1 if i < extra else 0)]
        start += len(part)
        contiguous = list(part) == list(range(part[0], part[-1] + 1))
        bindings.append((f"{part[0]}-{part[-1]}" if len(part) > 1 else str(part[0])) if contiguous else ",".join(map(str, part)))
    return bindings


def replica_actor_options(settings: EngineSettings, on_gpu: bool, cores: Sequence[int]) -> list[dict]:
    """Ray actor options for each replica: GPUs through Ray's accounting; on CPU, cores through vLLM's thread
    binding (the actor reserves no Ray CPUs: the binding is what keeps the engines apart) and each its own KV cache."""
    if on_gpu:
        return [{"num_gpus": settings.tensor_parallel_size} for _ in range(settings.replicas)]
    return [
        {
            "num_cpus": 0,
            "runtime_env": {"env_vars": {"VLLM_CPU_OMP_THREADS_BIND": binding, "VLLM_CPU_KVCACHE_SPACE": str(settings.cpu_kv_cache_gib)}},
        }
        for binding in split_cores(cores, settings.replicas)
    ]


async def start_ray_replicas(
    model_dir: str | Path, settings: EngineSettings, served_model_name: str | None = None, cache_dir: Path | None = None
) -> "ReplicatedEngine":
    """`settings.replicas` engines as Ray actors (on the cluster at `settings.ray_address`, or a local Ray); each
    keeps its compile cache under `cache_dir` (a path every node sees, or each node's own)."""
    ray = require_ray()
    await ray_cluster.join(settings.ray_address)
    try:
        return await _start_replicas_on_ray(ray, model_dir, settings, served_model_name, cache_dir)
    except BaseException:
        await ray_cluster.leave()
        raise


async def _start_replicas_on_ray(ray: Any, model_dir: str | Path, settings: EngineSettings, served_model_name: str | None, cache_dir: Path | None) -> "ReplicatedEngine":
    from vllm.tokenizers import get_tokenizer

    # The cluster's GPUs, not this process's: the API may run on a node without any (compose.yaml's does).
    on_gpu = ray.cluster_resources().get("GPU", 0) > 0
    cores = usable_cores()
    options = replica_actor_options(settings, on_gpu=on_gpu, cores=cores)
    actor_class = ray.remote(EngineActor)
    actor_args = (str(model_dir), settings.model_dump(), served_model_name, str(cache_dir) if cache_dir else None)
    started = itertools.count()

    def new_replica(index: int) -> Replica:
        # Named, so operators (and the failure test) can find a replica's actor: ray.get_actor(name, namespace="rstar").
        name = f"rstar-engine-{index}-{next(started)}"
        return RayReplica(actor_class, {**options[index], "name": name, "namespace": RAY_NAMESPACE}, actor_args, name)

    # vLLM's own tokenizer class, as VllmEngine's engine loads it, so templates render identically.
    tokenizer = await asyncio.to_thread(get_tokenizer, str(model_dir))
    router = Router(settings.replicas, settings.routing, max_in_flight=settings.max_num_seqs)
    return await ReplicatedEngine.start(new_replica, router, tokenizer, served_model_name or str(model_dir), str(model_dir), on_shutdown=ray_cluster.leave)


def wants_replicas(settings: EngineSettings) -> bool:
    """More than one engine, or engines on a Ray cluster; otherwise one VllmEngine in this process, no Ray."""
    return settings.replicas > 1 or settings.ray_address is not None


async def start_engine(
    model_dir: str | Path, settings: EngineSettings, served_model_name: str | None = None, cache_dir: Path | None = None
) -> TokenEngine:
    """The engine the settings ask for: `settings.replicas` behind a router, or the one in-process engine."""
    if wants_replicas(settings):
        return await start_ray_replicas(model_dir, settings, served_model_name, cache_dir)
    return await VllmEngine.start(model_dir, settings, served_model_name, cache_dir=cache_dir)
