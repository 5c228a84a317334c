"""Colocated trainer and engine: the engine (or every replica) sleeps for the update and wakes before the weight
sync and the next rollouts; where vLLM has no sleep mode (this CPU) the run says so in one line and goes on awake."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from rstar.rl.checkpoint import TrainerState
from rstar.rl.data import Problem
from rstar.rl.grpo.colocate import EngineSleep
from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.rollout import RolloutEnv
from rstar.rl.grpo.train import run_step
from rstar.sandbox.schemas import VerifyResult
from rstar.sandbox.verify import score
from rstar.server.chat_template import rstar_template
from rstar.server.engine import VllmEngine
from rstar.server.engine_defaults import Choice, EngineDefaults, choose_sleep_mode, describe
from rstar.server.replicas import ReplicatedEngine
from rstar.server.routing import Router
from tests.local_replica import LocalReplica
from tests.scripted_engine import ScriptedEngine
from tests.scripted_sandbox import ScriptedSandbox

RIGHT, WRONG = "</reason>\n<answer>\\boxed{2}</answer>", "</reason>\n<answer>\\boxed{3}</answer>"


class Grading(ScriptedSandbox):
    async def verify(self, response, gold, timeout_s=None, rule="boxed"):
        return VerifyResult(correct=score(response, gold, rule), status="ok")


class SleepingEngine(ScriptedEngine):
    """A scripted engine with sleep mode that writes down, in order, every rollout, sleep and wake."""

    def __init__(self, tokenizer, events: list[str], sleep_unavailable: str | None = None):
        super().__init__(tokenizer, [RIGHT, WRONG] * 20, sleep_unavailable=sleep_unavailable)
        self.events = events

    async def generate(self, prompt_ids, options, request_id=None):
        if not self.events or self.events[-1] != "rollout":
            self.events.append("rollout")
        async for delta in super().generate(prompt_ids, options, request_id):
            yield delta

    async def sleep(self) -> None:
        await super().sleep()
        self.events.append("sleep")

    async def wake_up(self) -> None:
        await super().wake_up()
        self.events.append("wake")


class Trainer:
    def __init__(self, asleep: Callable[[], bool], events: list[str], fail: bool = False):
        self.asleep, self.events, self.fail = asleep, events, fail

    def update(self, trees, config):
        assert self.asleep(), "the update ran beside an awake engine"
        self.events.append("update")
        if self.fail:
            raise RuntimeError("out of memory")
        return {"logprob_gap": 0.0}


class Sync:
    def __init__(self, engine, events: list[str], weights_dir):
        self.engine, self.events, self.weights_dir = engine, events, weights_dir

    async def sync(self):
        await self.engine.reload_weights(self.weights_dir)  # a scripted engine refuses a reload while asleep
        self.events.append("sync")
        return SimpleNamespace(weight_version=self.engine.weight_version, probe_gap=0.0, probe_change=None, probe_followed=None, probe_followed_error=None,
                               probe_replicas=1,
                               write_s=0.0, reload_s=0.0, seconds=0.0)


CONFIG = GRPOConfig(prompts_per_step=1, rollouts_per_prompt=2, keep_per_prompt=2, downsample="none", max_turns=1, max_response_tokens=64, reward="boxed")


async def steps(engine, trainer: Trainer, count: int, weights_dir) -> None:
    env = RolloutEnv(engine, rstar_template(engine.tokenizer), Grading())
    state = TrainerState(step=0, data_cursor=0, model_identity={})
    engine_sleep = EngineSleep(engine, CONFIG.sleep_engine)
    with ThreadPoolExecutor(max_workers=1) as torch_thread:
        for step in range(count):
            await run_step(env, trainer, Sync(engine, trainer.events, weights_dir), CONFIG, [Problem("p", "What is 1 + 1?", "2")], state, random.Random(0),
                           step, torch_thread, engine_sleep)


def test_the_engine_sleeps_for_the_update_and_wakes_before_the_sync_and_the_next_rollouts(default_tokenizer, tmp_path):
    assert CONFIG.sleep_engine  # the release's hybrid engine frees the rollout memory for training
    events: list[str] = []
    engine = SleepingEngine(default_tokenizer, events)
    asyncio.run(steps(engine, Trainer(lambda: engine.asleep, events), 2, tmp_path))
    assert events == ["rollout", "sleep", "update", "wake", "sync"] * 2


def test_a_failed_update_still_wakes_the_engine(default_tokenizer, tmp_path):
    events: list[str] = []
    engine = SleepingEngine(default_tokenizer, events)
    with pytest.raises(RuntimeError, match="out of memory"):
        asyncio.run(steps(engine, Trainer(lambda: engine.asleep, events, fail=True), 1, tmp_path))
    assert events == ["rollout", "sleep", "update", "wake"] and not engine.asleep  # a server-hosted run's engine serves on


class Replicas:
    """Sleeping scripted engines as in-process replicas; `engines[i]` is slot i's latest (a restart makes a new one)."""

    def __init__(self, tokenizer, events: list[str], sleep_unavailable: str | None = None):
        self.tokenizer, self.events, self.sleep_unavailable = tokenizer, events, sleep_unavailable
        self.engines: dict[int, SleepingEngine] = {}
        self.replicas: dict[int, LocalReplica] = {}

    def __call__(self, index: int) -> LocalReplica:
        async def start() -> SleepingEngine:
            self.engines[index] = SleepingEngine(self.tokenizer, self.events, self.sleep_unavailable)
            return self.engines[index]

        self.replicas[index] = LocalReplica(start, f"replica {index}")
        return self.replicas[index]


async def replicated(replicas: Replicas) -> ReplicatedEngine:
    return await ReplicatedEngine.start(replicas, Router(2), replicas.tokenizer, "scripted", stats_interval_s=0.05, restart_delay_s=0.01)


def test_every_replica_sleeps_for_the_update_and_one_restarting_meanwhile_sleeps_once_up(default_tokenizer, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")  # the replicated engine checks that a weights file is there
    events: list[str] = []
    replicas = Replicas(default_tokenizer, events)

    async def run():
        engine = await replicated(replicas)
        try:
            assert engine.sleep_unavailable is None
            await steps(engine, Trainer(lambda: all(e.asleep for e in replicas.engines.values()), events), 1, tmp_path)
            order = list(events)
            lost = replicas.engines[1]
            replicas.replicas[1].kill()
            await engine.sleep()  # replica 1 is found lost here, and restarts while replica 0 sleeps
            for _ in range(500):
                if replicas.engines[1] is not lost and all(replica["healthy"] for replica in engine.replicas()):
                    break
                await asyncio.sleep(0.01)
            restarted_asleep = replicas.engines[1].asleep
            await engine.wake_up()
            return order, restarted_asleep, [e.asleep for e in replicas.engines.values()]
        finally:
            await engine.shutdown()

    order, restarted_asleep, asleep_after = asyncio.run(run())
    assert order == ["rollout", "sleep", "sleep", "update", "wake", "wake", "sync"]
    assert restarted_asleep and asleep_after == [False, False]


def test_replicas_that_cannot_sleep_are_named_in_the_runs_line(default_tokenizer, caplog):
    async def run():
        engine = await replicated(Replicas(default_tokenizer, [], sleep_unavailable="vLLM has no sleep mode on cpu"))
        try:
            with caplog.at_level(logging.WARNING, logger="rstar.rl"):
                return EngineSleep(engine, wanted=True).active
        finally:
            await engine.shutdown()

    assert asyncio.run(run()) is False
    assert caplog.records[0].getMessage().startswith("sleep_engine: replica 0: vLLM has no sleep mode on cpu; the engine keeps")


def unstarted_engine(sleep_mode: Choice | None) -> VllmEngine:
    defaults = EngineDefaults(dtype=Choice("float32", ""), eager=Choice(True, ""), threads_bind=None, kv_cache="2 GiB", compile_cache=None, sleep_mode=sleep_mode)
    return VllmEngine(llm=None, model_name="m", max_model_len=64, tokenizer=None, defaults=defaults)


def test_on_this_cpu_vllm_has_no_sleep_mode_and_the_run_says_so_once(caplog):
    import torch

    from rstar.server.engine import sleep_mode_available

    if torch.cuda.is_available():
        pytest.skip("a GPU machine: vLLM has sleep mode there")
    assert sleep_mode_available() is False  # vllm.platforms.current_platform on the CPU build
    engine = unstarted_engine(choose_sleep_mode(True, "cpu", sleep_mode_available()))
    with caplog.at_level(logging.WARNING, logger="rstar.rl"):
        engine_sleep = EngineSleep(engine, wanted=True)
    assert not engine_sleep.active
    assert [r.getMessage() for r in caplog.records] == [
        "sleep_engine: vLLM has no sleep mode on cpu (CUDA, ROCm and XPU only); the engine keeps its weights and KV cache in memory while the trainer updates"
    ]


def test_an_engine_started_without_sleep_mode_is_named_and_a_run_that_does_not_want_it_says_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="rstar.rl"):
        assert not EngineSleep(unstarted_engine(None), wanted=False).active
        assert caplog.records == []
        assert not EngineSleep(unstarted_engine(None), wanted=True).active
    assert "RSTAR_ENGINE__SLEEP_MODE=true" in caplog.records[0].getMessage()
    assert unstarted_engine(Choice(True, "")).sleep_unavailable is None


def test_sleep_mode_is_chosen_from_the_setting_and_the_platform():
    assert choose_sleep_mode(False, "cuda", True) is None
    assert choose_sleep_mode(True, "cuda", True).value is True
    refused = choose_sleep_mode(True, "cpu", False)
    assert refused.value is False and "cpu" in refused.why
    assert describe(unstarted_engine(refused).defaults).endswith(f"sleep mode off ({refused.why})")


def test_a_server_hosted_run_never_sleeps_the_engine_that_serves_the_api(default_tokenizer, caplog):
    from rstar.server.limits import Admission, AdmittedGenerations

    async def build():  # the admission's condition belongs to a loop
        return AdmittedGenerations(SleepingEngine(default_tokenizer, []), Admission(4, 4, 1.0, 1), share=2)

    served = asyncio.run(build())
    with caplog.at_level(logging.WARNING, logger="rstar.rl"):
        assert not EngineSleep(served, wanted=True).active  # though the engine itself could sleep
    assert "serves this server's API" in caplog.records[0].getMessage()
