"""ReplicatedEngine over in-process replicas (scripted engines behind tests/local_replica.py): routing with the engines'
stats, queueing at the router, a replica lost mid-load (retry or a clear failure), restart, weight reloads on
every replica; and the Ray actor options for CPU and GPU."""

from __future__ import annotations

import asyncio
import sys

import pytest
from typer.testing import CliRunner

from rstar.config import EngineSettings
from rstar.server.engine import EngineFailed, SamplingOptions
from rstar.server.ray_replicas import RayNotInstalled, replica_actor_options, require_ray, split_cores
from rstar.server.replicas import ReplicatedEngine
from rstar.server.routing import Router
from tests.local_replica import LocalReplica
from tests.scripted_engine import ScriptedEngine

GREEDY = SamplingOptions(max_tokens=64, temperature=0.0)


class ScriptedReplicas:
    """A replica factory over scripted engines that remembers every replica and engine it made, per slot."""

    def __init__(self, tokenizer, reply: str = "Four.", fail_starts: int = 0, **engine_fields) -> None:
        self.tokenizer, self.reply, self.engine_fields = tokenizer, reply, engine_fields
        self.replicas: dict[int, list[LocalReplica]] = {}
        self.engines: dict[int, list[ScriptedEngine]] = {}
        self.fail_starts = fail_starts  # restarts (not first starts) that fail before one succeeds

    def __call__(self, index: int) -> LocalReplica:
        restarting = index in self.replicas

        async def start() -> ScriptedEngine:
            if restarting and self.fail_starts:
                self.fail_starts -= 1
                raise RuntimeError("no room for the engine")
            engine = ScriptedEngine(self.tokenizer, [self.reply], **self.engine_fields)
            self.engines.setdefault(index, []).append(engine)
            return engine

        replica = LocalReplica(start, f"replica {index}")
        self.replicas.setdefault(index, []).append(replica)
        return replica

    def current(self, index: int) -> ScriptedEngine:
        return self.engines[index][-1]


async def replicated(factory: ScriptedReplicas, replicas: int = 2, restart_delay_s: float = 0.01, **router_options) -> ReplicatedEngine:
    router = Router(replicas, **router_options)
    return await ReplicatedEngine.start(factory, router, factory.tokenizer, "scripted", stats_interval_s=0.05, restart_delay_s=restart_delay_s)


async def answer(engine: ReplicatedEngine, prompt: list[int], request_id: str | None = None) -> list[int]:
    tokens: list[int] = []
    async for delta in engine.generate(prompt, GREEDY, request_id):
        tokens.extend(delta.token_ids)
    return tokens


def served_by(factory: ScriptedReplicas, prompt: list[int]) -> list[int]:
    return sorted(i for i, engines in factory.engines.items() for engine in engines if prompt in engine.prompts)


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_cores_split_evenly_first_shares_larger():
    assert split_cores([0, 1], 2) == ["0", "1"]
    assert split_cores(list(range(8)), 3) == ["0-2", "3-5", "6-7"]
    assert split_cores([0, 2, 4, 6], 2) == ["0,2", "4,6"]
    with pytest.raises(ValueError, match="3 CPU replicas need at least 3 cores"):
        split_cores([0, 1], 3)


def test_actor_options_bind_cpu_cores_and_kv_per_replica_and_one_gpu_set_each():
    cpu = replica_actor_options(EngineSettings(replicas=2, cpu_kv_cache_gib=1), on_gpu=False, cores=[0, 1])
    assert [o["runtime_env"]["env_vars"] for o in cpu] == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "1"},
        {"VLLM_CPU_OMP_THREADS_BIND": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
    ]
    assert all(o["num_cpus"] == 0 for o in cpu)
    gpu = replica_actor_options(EngineSettings(replicas=3, tensor_parallel_size=2), on_gpu=True, cores=[0, 1])
    assert gpu == [{"num_gpus": 2}] * 3


def test_prompt_tokens_sent_since_the_last_stats_sample_count_against_free_kv(default_tokenizer):
    async def go():
        factory = ScriptedReplicas(default_tokenizer, kv_capacity_tokens=10_000)
        engine = await replicated(factory)
        engine.stats_interval_s = 3600  # no new sample during the test: only the sent tokens differ
        first, second = list(range(3000)), list(range(5000, 5100))
        await answer(engine, first)
        await answer(engine, second)
        report = engine.replicas()
        await engine.shutdown()
        return served_by(factory, first), served_by(factory, second), report

    first_on, second_on, report = asyncio.run(go())
    assert first_on == [0] and second_on == [1]
    assert [r["kv_free_tokens"] for r in report] == [7000, 9900]


def test_output_a_generation_may_still_write_counts_against_free_kv_until_it_ends(default_tokenizer):
    async def go():
        factory = ScriptedReplicas(default_tokenizer, kv_capacity_tokens=10_000, token_delay_s=0.05)
        engine = await replicated(factory)
        engine.stats_interval_s = 3600
        stream = engine.generate(list(range(100)), SamplingOptions(max_tokens=2_000, temperature=0.0))
        first = await anext(stream)
        during = engine.replicas()[0]["kv_free_tokens"]
        async for _ in stream:
            pass
        after = engine.replicas()[0]["kv_free_tokens"]
        await engine.shutdown()
        return len(first.token_ids), during, after

    written, during, after = asyncio.run(go())
    assert during == 10_000 - 100 - (2_000 - written)  # the prompt, and the reply's room less what it wrote
    assert after == 10_000 - 100


def test_the_next_turn_of_a_trajectory_goes_where_its_history_is(default_tokenizer):
    async def go():
        factory = ScriptedReplicas(default_tokenizer, kv_capacity_tokens=10_000)
        engine = await replicated(factory)
        other = list(range(7000, 7400))  # makes replica 0 the fuller one
        await answer(engine, other)
        turn_1 = list(range(64))
        reply = await answer(engine, turn_1)
        turn_2 = turn_1 + reply + list(range(900, 948))
        await answer(engine, turn_2)
        await engine.shutdown()
        return served_by(factory, turn_1), served_by(factory, turn_2)

    assert asyncio.run(go()) == ([1], [1])


def test_requests_beyond_every_replicas_capacity_wait_at_the_router(default_tokenizer):
    async def go():
        factory = ScriptedReplicas(default_tokenizer, token_delay_s=0.02)
        engine = await replicated(factory, max_in_flight=1)
        most_running = [0, 0]

        async def watch():
            while True:
                for i in (0, 1):
                    most_running[i] = max(most_running[i], len(factory.current(i).running))
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        work = [asyncio.create_task(answer(engine, [i] * 20)) for i in range(3)]
        await until(lambda: engine.stats().waiting == 1)
        replies = await asyncio.gather(*work)
        watcher.cancel()
        waiting_after = engine.stats().waiting
        await engine.shutdown()
        return replies, most_running, waiting_after

    replies, most_running, waiting_after = asyncio.run(go())
    assert all(replies) and most_running == [1, 1] and waiting_after == 0


def test_a_lost_replica_fails_streamed_answers_retries_unstarted_ones_and_comes_back(default_tokenizer):
    async def go():
        factory = ScriptedReplicas(default_tokenizer, reply="one two three four five six seven eight", token_delay_s=0.05, fail_starts=1)
        engine = await replicated(factory, policy="round_robin", restart_delay_s=0.3)
        streamed = engine.generate([1] * 20, GREEDY, "streamed")  # round robin: replica 0
        first = await anext(streamed)
        unstarted = asyncio.create_task(answer(engine, [2] * 20, "unstarted"))  # replica 1
        queued = asyncio.create_task(answer(engine, [3] * 20, "queued"))  # replica 0, no delta yet
        await until(lambda: "queued" in factory.current(0).running)
        factory.replicas[0][-1].kill()
        with pytest.raises(EngineFailed, match=r"engine replica 0 failed after streaming 1 tokens"):
            async for _ in streamed:
                pass
        health_when_lost = engine.replicas()[0]
        retried = await queued
        await unstarted
        await until(lambda: engine.replicas()[0]["healthy"])
        back = engine.replicas()[0]
        after = await answer(engine, [4] * 20)  # round robin comes back to replica 0
        await engine.shutdown()
        return first, retried, health_when_lost, back, after

    first, retried, lost, back, after = asyncio.run(go())
    assert first.token_ids and retried and after
    assert lost["healthy"] is False and "ReplicaDied" in lost["failure"] and lost["in_flight"] == 0
    assert back["healthy"] is True and back["restarts"] == 1 and back["failure"] is None


def test_with_every_replica_down_requests_fail_naming_each(default_tokenizer):
    async def go():
        factory = ScriptedReplicas(default_tokenizer, fail_starts=10_000)
        engine = await replicated(factory)
        for i in (0, 1):
            factory.replicas[i][0].kill()
        await until(lambda: not any(r["healthy"] for r in engine.replicas()))
        with pytest.raises(EngineFailed, match=r"no engine replica is healthy \(replica 0: ReplicaDied.*replica 1: ReplicaDied"):
            await answer(engine, [1] * 20)
        failed = engine.stats().failed
        await engine.shutdown()
        return failed

    assert asyncio.run(go()).startswith("no engine replica is healthy")


def test_weights_reload_on_every_replica_and_a_restarted_one_loads_them_too(default_tokenizer, tmp_path):
    """Each replica reports the weight version it loaded and answers the probe itself (the weight-sync probe
    reads every replica, not the one the router would pick)."""
    (tmp_path / "model.safetensors").write_bytes(b"")

    async def go():
        factory = ScriptedReplicas(default_tokenizer)
        engine = await replicated(factory)
        await answer(engine, list(range(64)))
        before = [r["weight_version"] for r in engine.replicas()]
        await engine.reload_weights(tmp_path)
        versions = [factory.current(i).weight_version for i in (0, 1)]
        reported = [r["weight_version"] for r in engine.replicas()]
        probed = await engine.replica_prompt_logprobs([1, 2, 3])
        factory.replicas[1][-1].kill()
        await until(lambda: engine.replicas()[1]["restarts"] == 1)
        restarted = factory.current(1).weight_version, engine.replicas()[1]["weight_version"]
        await engine.shutdown()
        return engine.weight_version, before, versions, reported, probed, restarted

    version, before, versions, reported, probed, restarted = asyncio.run(go())
    assert (version, before, versions, reported) == (1, [0, 0], [1, 1], [1, 1])
    assert probed == {0: [-2.0, -2.0], 1: [-2.0, -2.0]}  # both replicas read at weight version 1
    assert restarted == (1, 1)


def test_an_adapter_loads_on_every_replica_and_a_restarted_one_loads_weights_then_adapter(default_tokenizer, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")

    async def go():
        factory = ScriptedReplicas(default_tokenizer)
        engine = await replicated(factory)
        await engine.reload_weights(tmp_path)
        await engine.load_adapter(tmp_path / "adapter")
        adapters = [factory.current(i).adapter for i in (0, 1)]
        factory.replicas[0][-1].kill()
        await until(lambda: engine.replicas()[0]["restarts"] == 1)
        restarted = factory.current(0)
        await engine.shutdown()
        return engine.weight_version, adapters, (restarted.weight_version, restarted.adapter), [r["weight_version"] for r in engine.replicas()]

    version, adapters, restarted, reported = asyncio.run(go())
    assert version == 2 and adapters == [str(tmp_path / "adapter")] * 2
    assert restarted == (2, str(tmp_path / "adapter")) and reported == [2, 2]  # reloaded, then the adapter on top


def test_a_replica_lost_while_probed_is_left_out_and_none_healthy_is_an_error(default_tokenizer):
    async def go():
        factory = ScriptedReplicas(default_tokenizer, fail_starts=100)  # lost replicas do not come back
        engine = await replicated(factory, restart_delay_s=60)
        factory.replicas[0][-1].kill()
        one = await engine.replica_prompt_logprobs([1, 2])
        factory.replicas[1][-1].kill()
        await engine.replica_prompt_logprobs([1, 2])  # replica 1 is found dead here and taken out
        with pytest.raises(EngineFailed, match="no engine replica is healthy to probe"):
            await engine.replica_prompt_logprobs([1, 2])
        await engine.shutdown()
        return one

    assert asyncio.run(go()) == {1: [-1.0]}


def test_abort_reaches_the_replica_holding_the_request(default_tokenizer):
    async def go():
        factory = ScriptedReplicas(default_tokenizer, reply="a b c d e f g h", token_delay_s=0.05)
        engine = await replicated(factory, policy="round_robin")
        await answer(engine, [5] * 20)  # replica 0; the next goes to replica 1
        stream = engine.generate([6] * 20, GREEDY, "to-abort")
        await anext(stream)
        await engine.abort("to-abort")
        await stream.aclose()
        aborted = factory.current(1).aborted
        await engine.shutdown()
        return aborted

    assert "to-abort" in asyncio.run(go())


def test_stats_add_up_over_replicas_and_shutdown_stops_every_engine(default_tokenizer):
    async def go():
        factory = ScriptedReplicas(default_tokenizer, kv_capacity_tokens=4096)
        engine = await replicated(factory, replicas=3)
        stats = engine.stats()
        await engine.shutdown()
        return stats, [factory.current(i).closed for i in range(3)]

    stats, closed = asyncio.run(go())
    assert stats.kv_capacity_tokens == 3 * 4096 and stats.failed is None and closed == [True] * 3


def test_health_lists_the_replicas(default_tokenizer, tmp_path):
    from fastapi.testclient import TestClient

    from rstar.app import build_app
    from rstar.config import load_settings
    from tests.scripted_sandbox import ScriptedSandbox

    factory = ScriptedReplicas(default_tokenizer, kv_capacity_tokens=2048)

    async def start_engine():
        return await replicated(factory)

    app = build_app(load_settings(data_dir=tmp_path), start_engine, "scripted", sandbox_factory=ScriptedSandbox)
    with TestClient(app, base_url="http://localhost") as http:
        body = http.get("/health").json()
    assert [(r["index"], r["healthy"], r["restarts"], r["in_flight"], r["kv_capacity_tokens"]) for r in body["replicas"]] == [
        (0, True, 0, 0, 2048),
        (1, True, 0, 0, 2048),
    ]


def test_replicas_without_ray_say_how_to_install_it(monkeypatch):
    from rstar.cli import app

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(RayNotInstalled, match=r"bash install.sh cpu,ray"):
        require_ray()
    result = CliRunner().invoke(app, ["serve", "--replicas", "2", "--port", "0"])
    assert result.exit_code == 2
    assert "bash install.sh cpu,ray" in result.output


def test_metrics_of_every_answering_replica_come_back_labelled(default_tokenizer):
    factory = ScriptedReplicas(default_tokenizer)

    async def scenario():
        engine = await replicated(factory, replicas=3)
        for index, replica in enumerate(factory.replicas[i][-1] for i in range(3)):

            async def text(index=index, in_process=replica.prometheus_text):
                await in_process()  # raises ReplicaDied once the replica is killed, as a dead actor's call does
                return f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\"}} {index + 1}\n"

            replica.prometheus_text = text
        factory.replicas[1][-1].kill()
        try:
            return await engine.replica_metrics()
        finally:
            await engine.shutdown()

    text = asyncio.run(scenario()).decode()
    assert 'vllm:num_requests_running{engine="0",replica="0"} 1.0' in text
    assert 'vllm:num_requests_running{engine="0",replica="2"} 3.0' in text
    assert 'replica="1"' not in text  # killed: left out of this scrape
