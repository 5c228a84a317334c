"""Prometheus metrics of the API server, served at /metrics.

Ours live in one registry per app (not prometheus_client's global one), so several apps in one process
(tests, the benchmark) count separately. The engine's gauges are read at scrape time, so they are never stale.

vLLM's own engine metrics (`vllm:*`: prefix-cache queries and hits, running/waiting requests, KV-cache usage,
preemptions, iteration tokens, TTFT and latency histograms) are what `vllm serve` users scrape and have
dashboards for. AsyncLLM always registers them in prometheus_client's global registry, one engine per process,
so /metrics serves that registry after ours, unchanged. Engine replicas run in processes of their own (Ray
actors): their `vllm:*` families are fetched at scrape time and served once each, every sample labelled with
its `replica` (`merge_replica_metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rstar.server.engine import EngineStats, TokenEngine

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Sandbox statuses that are the sandbox's fault, not the program's.
SANDBOX_FAILURES = frozenset({"internal_error", "queue_timeout"})


class ServerMetrics:
    def __init__(self, engine: TokenEngine):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("rstar_requests", "HTTP requests answered, by route and status code.", ["route", "status"], registry=registry)
        self.prompt_tokens = Counter("rstar_prompt_tokens", "Prompt tokens of generation requests.", registry=registry)
        self.generation_tokens = Counter("rstar_generation_tokens", "Tokens the model sampled.", registry=registry)
        self.tool_tokens = Counter("rstar_tool_tokens", "Tokens of tool turns fed back to the model.", registry=registry)
        self.time_to_first_token = Histogram(
            "rstar_time_to_first_token_seconds", "From request arrival to the first generated text.", buckets=_LATENCY_BUCKETS, registry=registry
        )
        self.request_latency = Histogram(
            "rstar_request_duration_seconds", "Requests by route, arrival to last byte.", ["route"], buckets=_LATENCY_BUCKETS, registry=registry
        )
        self.tool_calls = Counter("rstar_tool_calls", "Built-in tool calls, by tool and sandbox status.", ["tool", "status"], registry=registry)
        self.tool_latency = Histogram(
            "rstar_tool_latency_seconds", "Built-in tool calls, sandbox queueing included.", ["tool"], buckets=_LATENCY_BUCKETS, registry=registry
        )
        self.sandbox_failures = Counter(
            "rstar_sandbox_failures", "Tool calls the sandbox could not run (internal_error, queue_timeout, unreachable).", registry=registry
        )
        self.rejected = Counter("rstar_rejected_requests", "Requests refused by a limit, by reason.", ["reason"], registry=registry)
        self.client_disconnects = Counter("rstar_client_disconnects", "Requests whose client left before the answer ended.", registry=registry)
        running = Gauge("rstar_engine_running_requests", "Requests the engine scheduled in its last step.", registry=registry)
        waiting = Gauge("rstar_engine_waiting_requests", "Requests waiting in the engine's scheduler.", registry=registry)
        kv_usage = Gauge("rstar_engine_kv_cache_usage", "KV-cache blocks in use, 0..1.", registry=registry)
        running.set_function(lambda: engine.stats().running)
        waiting.set_function(lambda: engine.stats().waiting)
        kv_usage.set_function(lambda: engine.stats().kv_cache_usage)
        # The rStar system prompt is ~300 tokens of every request: this says whether the prefix cache absorbs it.
        prefix_hit_rate = Gauge(
            "rstar_engine_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / prompt tokens looked up, since start.", registry=registry
        )
        prefix_hit_rate.set_function(lambda: prefix_cache_hit_rate(engine.stats()))

    def render(self, replica_metrics: bytes = b"") -> bytes:
        """Our metrics, then the process-wide registry's (vLLM's engine metrics where a vLLM engine runs here), then
        those of engine replicas in other processes."""
        return generate_latest(self.registry) + generate_latest(REGISTRY) + replica_metrics


class _Families:
    """A collector of metric families already built (a scrape's snapshot)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def merge_replica_metrics(expositions: Sequence[str | None]) -> bytes:
    """vLLM's metric families from each replica's Prometheus text (None: the replica did not answer) as one
    exposition: each family once, each sample with a `replica` label, the replica's index. Only `vllm:*` families
    are taken: the replicas' process and runtime metrics share their names with this process's own."""
    families: dict[str, Metric] = {}
    for replica, text in enumerate(expositions):
        for family in text_string_to_metric_families(text or ""):
            if not family.name.startswith("vllm:"):
                continue
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type, family.unit))
            merged.samples.extend(sample._replace(labels={**sample.labels, "replica": str(replica)}) for sample in family.samples)
    if not families:
        return b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


def prefix_cache_hit_rate(stats: EngineStats) -> float:
    return stats.prefix_cache_hits / stats.prefix_cache_queries if stats.prefix_cache_queries else 0.0


class RequestCounter:
    """ASGI middleware counting answered requests by route template and status (pure ASGI: streams pass
    through untouched). `metrics` returns the app's ServerMetrics, or None before start-up finished."""

    def __init__(self, app: ASGIApp, metrics: Callable[[], ServerMetrics | None]):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {}
        started = time.perf_counter()

        async def recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording)
        finally:
            metrics = self.metrics()
            if metrics is not None and "code" in status:
                # The router records the matched route in the scope; unmatched paths share one label.
                route = getattr(scope.get("route"), "path", "unmatched")
                metrics.requests.labels(route, str(status["code"])).inc()
                metrics.request_latency.labels(route).observe(time.perf_counter() - started)
                if status["code"] in (413, 429, 504):
                    metrics.rejected.labels(str(status["code"])).inc()
