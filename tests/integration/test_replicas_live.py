"""`rstar serve --replicas 2` on a local Ray cluster the test starts: two real CPU engines of the default model
behind one API, answering the openai client, vLLM's metrics of both in /metrics; one replica's actor killed
(ray.kill) mid-load: the other keeps answering, the requests on the dead one fail with a clear error or are
retried, and it comes back in /health.

Two engines plus Ray take about 10 GB: run it alone, under `flock /tmp/rstar-engine.lock`."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DEFAULT_MODEL_NAME
from tests.processes import free_port, start_logged
from tests.waiting import wait_for


@dataclass
class RayCluster:
    address: str
    env: dict  # what joins it: token authentication on, with this cluster's own token
    head_pid: int


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A one-node Ray cluster, as `ray start` makes one. `--block` ties every Ray process of it to the one
    started here, so stopping that stops this cluster and no other on the machine. Processes that join get
    the token in their environment from their start (Ray reads it once, so this process stays out of Ray)."""
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    command = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
               "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={tmp_path_factory.mktemp('ray')}"]
    head = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield RayCluster(f"127.0.0.1:{port}", env, head.pid)
    finally:
        head.terminate()
        head.wait(60)


def engine_cores(cluster: RayCluster) -> set[int]:
    """The vLLM EngineCore processes the cluster's actors started."""
    return {p.pid for p in psutil.Process(cluster.head_pid).children(recursive=True) if "EngineCore" in " ".join(p.cmdline())}


def kill_actor(cluster: RayCluster, name: str) -> None:
    """ray.kill, from a process that joins the cluster, on the named actor."""
    script = f"import ray; ray.init(address={cluster.address!r}, logging_level='warning'); ray.kill(ray.get_actor({name!r}, namespace='rstar'), no_restart=True)"
    subprocess.run([sys.executable, "-c", script], env=cluster.env, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def replicated_server(tmp_path_factory, default_model_dir, ray_cluster):
    port = free_port()
    data_dir = tmp_path_factory.mktemp("replicas-data")
    env = {**ray_cluster.env, "RSTAR_DATA_DIR": str(data_dir), "RSTAR_ENGINE__MAX_MODEL_LEN": "2048", "RSTAR_ENGINE__CPU_KV_CACHE_GIB": "1",
           "RSTAR_ENGINE__ENFORCE_EAGER": "true"}  # replicas and their failures are the subject; test_serve_cli starts the compiled default
    base_url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "rstar.cli", "serve", "--port", str(port), "--replicas", "2", "--ray-address", ray_cluster.address]
    process = start_logged(command, env, data_dir / "serve.log", f"{base_url}/health")
    yield base_url, data_dir / "serve.log", ray_cluster
    process.terminate()
    process.wait(60)


def ask(base_url: str, question: str) -> int:
    """A chat answer's token count."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    completion = client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=[{"role": "user", "content": question}], max_tokens=24, temperature=0)
    assert completion.choices[0].finish_reason in ("stop", "length", "tool_calls")
    return completion.usage.completion_tokens


def replicas(base_url: str) -> list[dict]:
    return httpx.get(f"{base_url}/health", timeout=10).json()["replicas"]


def test_two_replicas_answer_the_openai_client(replicated_server):
    base_url, _, _ = replicated_server
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: ask(base_url, f"Count from {i} to {i + 5}."), range(4)))
    assert all(tokens > 0 for tokens in answers)
    listed = replicas(base_url)
    assert [(r["index"], r["healthy"], r["restarts"]) for r in listed] == [(0, True, 0), (1, True, 0)]
    assert all(r["kv_capacity_tokens"] > 0 for r in listed)
    # vLLM's metrics live in the replicas' processes; /metrics serves each family once, labelled by replica.
    wait_for(lambda: sum(vllm_samples(base_url, "vllm:request_success_total").values()) >= 4, 10, "the answers are not in vLLM's counters")
    assert set(vllm_samples(base_url, "vllm:request_success_total")) == {"0", "1"}
    exposition = httpx.get(f"{base_url}/metrics", timeout=30).text
    assert exposition.count("# TYPE vllm:request_success_total ") == 1 and "rstar_requests_total" in exposition


def vllm_samples(base_url: str, name: str) -> dict[str, float]:
    """A vLLM counter from /metrics, summed per replica."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{base_url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name == name:
                totals[sample.labels["replica"]] = totals.get(sample.labels["replica"], 0.0) + sample.value
    return totals


class Streams:
    """Long completions streamed on threads, each counting its chunks, so a test can act once all are under way
    and end them once they have shown what they must, whatever the machine's speed."""

    def __init__(self, base_url: str, count: int, max_tokens: int):
        self.base_url, self.max_tokens = base_url, max_tokens
        self.chunks = [0] * count
        self.chunks_at_kill: list[int] | None = None
        self.enough = threading.Event()  # set when the survivors have streamed on past the kill
        self.pool = ThreadPoolExecutor(count)
        self.futures = [self.pool.submit(self._stream, i) for i in range(count)]

    def _stream(self, i: int) -> tuple[str, int]:
        """("survived", chunks after the kill) once `enough` is set, or ("failed", message) on an error event."""
        client = openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0)
        try:
            stream = client.completions.create(model=DEFAULT_MODEL_NAME, prompt=f"A long story about the number {i}:",
                                               max_tokens=self.max_tokens, temperature=0, stream=True, extra_body={"ignore_eos": True})
            with stream:
                for chunk in stream:
                    self.chunks[i] += bool(chunk.choices and chunk.choices[0].text)
                    if self.enough.is_set():
                        return "survived", self.chunks[i] - self.chunks_at_kill[i]
            return "finished", self.chunks[i]  # the whole answer before the test was done with it: too short a stream
        except openai.APIError as exc:
            return "failed", str(exc)

    def outcomes(self, timeout_s: float) -> list[tuple[str, int | str]]:
        try:
            return [future.result(timeout=timeout_s) for future in self.futures]
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)


def test_a_killed_replica_is_survived_and_comes_back(replicated_server):
    base_url, log_path, cluster = replicated_server
    victim = replicas(base_url)[0]["name"]
    cores_before = engine_cores(cluster)
    # Far more tokens than stream before the kill lands, so every stream is still going when it does.
    streams = Streams(base_url, 8, max_tokens=1500)
    wait_for(lambda: all(streams.chunks) and all(r["in_flight"] > 0 for r in replicas(base_url)), 120,
             f"not every stream was under way on both replicas: {streams.chunks}, {replicas(base_url)}")
    kill_actor(cluster, victim)
    wait_for(lambda: not replicas(base_url)[0]["healthy"], 60, "replica 0 is still listed healthy after its actor was killed")
    streams.chunks_at_kill = list(streams.chunks)
    # The survivors' streams keep going: each shows 10 more chunks before the test ends them.
    wait_for(lambda: sum(now - then >= 10 for now, then in zip(streams.chunks, streams.chunks_at_kill)) >= 1, 120,
             f"no stream went on after the kill: {streams.chunks} vs {streams.chunks_at_kill}")
    streams.enough.set()
    outcomes = streams.outcomes(timeout_s=120)
    failed = [detail for kind, detail in outcomes if kind == "failed"]
    survived = [detail for kind, detail in outcomes if kind == "survived"]
    # Replica 0's share had streamed when it died: those fail, naming it; replica 1's share streams on.
    assert failed and all("engine replica 0 failed after streaming" in message for message in failed), outcomes
    assert survived and len(failed) + len(survived) == len(outcomes), outcomes
    assert ask(base_url, "Say hello.") > 0  # the survivor keeps answering while replica 0 restarts

    deadline = time.time() + 240
    while not ((state := replicas(base_url)[0])["healthy"] and state["restarts"] == 1):
        assert time.time() < deadline, f"replica 0 did not come back: {state}; {log_path.read_text()[-3000:]}"
        time.sleep(2)
    assert state["name"] != victim
    # The dead actor's EngineCore went with it (no orphan holding its memory): one old core left, one new one.
    cores_after = engine_cores(cluster)
    assert len(cores_before) == 2 and len(cores_after) == 2 and len(cores_before & cores_after) == 1
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in cores_before - cores_after)
    with ThreadPoolExecutor(4) as pool:
        assert all(tokens > 0 for tokens in pool.map(lambda i: ask(base_url, f"Name {i} colours."), range(4)))
