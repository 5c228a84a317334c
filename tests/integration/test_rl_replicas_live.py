"""Weight sync onto real CPU engines: two replicas behind the router (`rstar serve --replicas 2` without Ray: the
session engine and a second engine of the default model, each behind tests/local_replica.py): after each sync
both serve the new weight version and pass their own probe, and one replica left on stale weights stops the
sync naming it. The router sends rollouts to every replica already (test_replicas); this is the half after.
The second engine serves LoRA adapters too, so the LoRA sync is shown on it as well: the adapter the trainer
saved, loaded by vLLM, passes the fp32 probe, and an engine that keeps its old adapter is stopped. The second
engine runs fp32 on every machine kind, which is where a repeated RL step repeats its samples: shown on it too."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rstar.config import EngineSettings
from rstar.rl.data import Problem
from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.rollout import RolloutEnv, generate
from rstar.rl.grpo.train import probe_tolerance
from rstar.rl.grpo.weight_sync import WeightSync, WeightSyncFailed, kept_stale
from rstar.rl.policy import Policy
from rstar.sandbox.clients import LocalClient
from rstar.sandbox.settings import SandboxSettings
from rstar.server.chat_template import rstar_template
from rstar.server.engine import VllmEngine
from rstar.server.replicas import ReplicatedEngine
from rstar.server.routing import Router
from tests.conftest import DEFAULT_MODEL_NAME
from tests.local_replica import LocalReplica


LORA = GRPOConfig(lora_rank=8)
PROBE_TEXT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."


class SharedReplica(LocalReplica):
    """An engine the module owns as a replica: the router must not shut it down."""

    async def shutdown(self) -> None:
        pass


class FaultyReplica(SharedReplica):
    """A replica whose reloads load nothing once `stale` is set."""

    stale = False

    async def reload_weights(self, weights_dir: str) -> None:
        if not self.stale:
            await super().reload_weights(weights_dir)


@pytest.fixture(scope="module")
def second_engine(loop_thread, default_model_dir):
    # Small: a window and KV cache enough for the probe, so two engines and a trainer fit beside the tests' others.
    settings = EngineSettings(dtype="float32", max_model_len=2048, max_num_seqs=4, enforce_eager=True, cpu_kv_cache_gib=1, max_lora_rank=LORA.lora_rank)
    second = loop_thread.run(VllmEngine.start(default_model_dir, settings, DEFAULT_MODEL_NAME))
    yield second
    loop_thread.run(second.shutdown())


def test_both_replicas_serve_each_synced_version_and_a_stale_one_is_named(engine, second_engine, loop_thread, default_model_dir, restore_engine_weights):
    async def session_engine():
        return engine

    async def other_engine():
        return second_engine

    replicas = [SharedReplica(session_engine, "replica 0"), FaultyReplica(other_engine, "replica 1")]
    policy = Policy(default_model_dir, "float32")
    probe = engine.tokenizer.encode(PROBE_TEXT)
    torch_thread = ThreadPoolExecutor(max_workers=1)

    def nudge() -> None:
        """An update the probe sees: the final norm's scale up by 5% sharpens every next-token distribution."""
        with torch.no_grad():
            policy.causal_lm.model.norm.weight.mul_(1.05)

    async def go():
        replicated = await ReplicatedEngine.start(lambda index: replicas[index], Router(2), engine.tokenizer, DEFAULT_MODEL_NAME)
        sync = WeightSync(replicated, policy, probe, probe_tolerance(GRPOConfig(), "float32", engine.dtype), engine.dtype, torch_thread)
        try:
            reports = [await sync.sync()]
            nudge()
            reports.append(await sync.sync())
            versions = [r["weight_version"] for r in replicated.replicas()]
            nudge()
            replicas[1].stale = True
            # fp32 (this machine): the gap names it; bf16: the gap may stay in tolerance and "followed" names it.
            with pytest.raises(WeightSyncFailed, match="after loading weight version 3, engine replica 1's logprobs") as stale:
                await sync.sync()
            return reports, versions, stale.value
        finally:
            sync.close()
            await replicated.shutdown()

    try:
        reports, versions, stale = loop_thread.run(go(), timeout=600)
    finally:
        torch_thread.shutdown()
    assert [r.probe_replicas for r in reports] == [2, 2]
    assert versions == [2, 2]  # each replica reports the version it loaded
    assert reports[1].probe_change > 1e-2 and not kept_stale(reports[1].probe_followed, reports[1].probe_followed_error), reports[1]
    assert "engine replica 0" not in str(stale)  # replica 0, probed first, reloaded and passed its own probe


class KeepsItsAdapter:
    """The engine with a fault: adapter loads bump the weight version and load nothing."""

    def __init__(self, engine):
        self.engine, self.weight_version = engine, engine.weight_version

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def load_adapter(self, adapter_dir) -> None:
        self.weight_version += 1


def test_the_adapter_vllm_loads_passes_the_probe_and_a_kept_old_one_is_stopped(second_engine, loop_thread, default_model_dir):
    policy = Policy(default_model_dir, "float32", lora=LORA.lora())
    probe = second_engine.tokenizer.encode(PROBE_TEXT)
    tolerance = probe_tolerance(LORA, "float32", second_engine.dtype)

    def train_the_adapter(seed: int) -> None:
        """What a step does to the adapter, in effect: LoRA's B starts at zero (the adapter adds nothing), so give it weights."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, parameter in policy.model.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)

    async def go():
        await second_engine.reload_weights(default_model_dir)  # the base the adapter is trained on, whatever the test before left
        with ThreadPoolExecutor(max_workers=1) as torch_thread:
            sync = WeightSync(second_engine, policy, probe, tolerance, second_engine.dtype, torch_thread)
            stale_sync = WeightSync(KeepsItsAdapter(second_engine), policy, probe, tolerance, second_engine.dtype, torch_thread)
            try:
                base = await second_engine.prompt_logprobs(probe)
                train_the_adapter(0)
                served = await sync.sync()
                adapted = await second_engine.prompt_logprobs(probe)
                train_the_adapter(1)
                with pytest.raises(WeightSyncFailed, match="not serving the trained weights") as stale:
                    await stale_sync.sync()
                return served, stale.value, sum(abs(a - b) for a, b in zip(adapted, base)) / len(base)
            finally:
                sync.close()
                stale_sync.close()
                await second_engine.load_adapter(None)

    served, stale, moved = loop_thread.run(go(), timeout=600)
    assert served.probe_gap < tolerance, served  # fp32 both sides: the adapter as vLLM applies it is the trainer's
    assert moved > 1e-2  # and the adapter moved the logprobs the probe reads: the gap did not pass by the base alone
    assert second_engine.adapter is None


def test_a_repeated_step_samples_the_same_first_turns_on_an_fp32_engine(second_engine, loop_thread, default_model_dir):
    """rl/README's promise: a resumed step asks for the same problems with the same seeds, and on an fp32 engine
    the samples repeat too. Only each trajectory's first turn: later turns read tool results that carry the
    cell's measured execution time. The first pass caches the prompt, so the two compared passes both start
    from it (a cached prefix takes another kernel path than a fresh prefill)."""
    config = GRPOConfig(max_turns=2, max_response_tokens=96)
    problems = [Problem("0", "What is 4821 times 937?", "4517277")]

    async def go():
        await second_engine.reload_weights(default_model_dir)  # whatever an earlier test synced
        async with LocalClient(SandboxSettings(uid_base=64650)) as sandbox:
            env = RolloutEnv(second_engine, rstar_template(second_engine.tokenizer), sandbox)
            return [(await generate(env, problems, 2, config, seed=5, step=3))[0] for _ in range(3)]

    _, first, second = loop_thread.run(go(), timeout=600)

    def first_turns(group):
        return [(t.turns[0].seed, t.response_ids[t.turns[0].start : t.turns[0].end]) for t in group]

    assert first_turns(first) == first_turns(second)
    assert first[0].turns[0].seed != first[1].turns[0].seed  # each sample of a group draws with its own seed
    assert all(t.turns[0].end - t.turns[0].start > 0 for t in first)
