"""Merging engine replicas' Prometheus metrics into one exposition for /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rstar.server.metrics import merge_replica_metrics


def replica_exposition(successes: int, running: int) -> str:
    """What a replica's process serves: vLLM's families (labelled by engine, as vLLM does) and a process metric."""
    registry = CollectorRegistry()
    Counter("vllm:request_success", "Finished requests.", ["engine"], registry=registry).labels("0").inc(successes)
    Gauge("vllm:num_requests_running", "Running requests.", ["engine"], registry=registry).labels("0").set(running)
    latency = Histogram("vllm:e2e_request_latency_seconds", "Request latency.", ["engine"], buckets=(0.1, 1.0), registry=registry)
    latency.labels("0").observe(0.5)
    Gauge("process_open_fds", "Open file descriptors.", registry=registry).set(42)
    return generate_latest(registry).decode()


def samples(exposition: bytes) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels.get("replica", "")): sample.value
        for family in text_string_to_metric_families(exposition.decode())
        for sample in family.samples
        if not sample.name.endswith("_created") and "le" not in sample.labels
    }


def test_each_family_once_each_sample_labelled_by_its_replica():
    merged = merge_replica_metrics([replica_exposition(3, 1), None, replica_exposition(5, 2)])
    text = merged.decode()
    for family in ("vllm:request_success_total", "vllm:num_requests_running", "vllm:e2e_request_latency_seconds"):
        assert text.count(f"# TYPE {family} ") == 1, text
    assert samples(merged) == {
        ("vllm:request_success_total", "0"): 3.0,
        ("vllm:request_success_total", "2"): 5.0,
        ("vllm:num_requests_running", "0"): 1.0,
        ("vllm:num_requests_running", "2"): 2.0,
        ("vllm:e2e_request_latency_seconds_count", "0"): 1.0,
        ("vllm:e2e_request_latency_seconds_count", "2"): 1.0,
        ("vllm:e2e_request_latency_seconds_sum", "0"): 0.5,
        ("vllm:e2e_request_latency_seconds_sum", "2"): 0.5,
    }
    # The replicas' own labels stay; their process metrics would clash with this process's and are left out.
    assert 'vllm:num_requests_running{engine="0",replica="2"} 2.0' in text
    assert "process_open_fds" not in text


def test_no_replica_answering_gives_nothing():
    assert merge_replica_metrics([None, None]) == b""
    assert merge_replica_metrics([]) == b""
