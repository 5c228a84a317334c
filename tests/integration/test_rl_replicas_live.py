"""Weight sync onto two real CPU engine replicas behind the router (`rstar serve --replicas 2` without Ray: the
session engine and a second engine of the default model, each behind tests/local_replica.py): after each sync
both serve the new weight version and pass their own probe, and one replica left on stale weights stops the
sync naming it. The router sends rollouts to every replica already (test_replicas); this is the half after."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rstar.config import EngineSettings
from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.train import probe_tolerance
from rstar.rl.grpo.weight_sync import MIN_FOLLOWED, WeightSync, WeightSyncFailed
from rstar.rl.policy import Policy
from rstar.server.engine import VllmEngine
from rstar.server.replicas import ReplicatedEngine
from rstar.server.routing import Router
from tests.conftest import DEFAULT_MODEL_NAME
from tests.local_replica import LocalReplica


class FaultyReplica(LocalReplica):
    """A replica whose reloads load nothing once `stale` is set."""

    stale = False

    async def reload_weights(self, weights_dir: str) -> None:
        if not self.stale:
            await super().reload_weights(weights_dir)


class SharedReplica(LocalReplica):
    """The session engine as a replica: the router must not shut it down."""

    async def shutdown(self) -> None:
        pass


def test_both_replicas_serve_each_synced_version_and_a_stale_one_is_named(engine, loop_thread, default_model_dir, restore_engine_weights):
    async def second_engine():
        # Small: a window and KV cache enough for the probe, so two engines and a trainer fit beside the tests' others.
        return await VllmEngine.start(default_model_dir, EngineSettings(max_model_len=2048, max_num_seqs=4, enforce_eager=True, cpu_kv_cache_gib=1), DEFAULT_MODEL_NAME)

    async def session_engine():
        return engine

    replicas = [SharedReplica(session_engine, "replica 0"), FaultyReplica(second_engine, "replica 1")]
    policy = Policy(default_model_dir, "float32")
    probe = engine.tokenizer.encode("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.")
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
    assert reports[1].probe_change > 1e-2 and reports[1].probe_followed >= MIN_FOLLOWED, reports[1]
    assert "engine replica 0" not in str(stale)  # replica 0, probed first, reloaded and passed its own probe
