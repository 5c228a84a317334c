"""The weight-sync probe can fail: a reload that kept stale weights stops the run, though its gap alone stays
within a bf16 engine's tolerance. On a stand-in engine and policy whose logprobs the test sets; the live RL test
injects the same fault into the real engine."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

from rstar.rl.grpo.weight_sync import MIN_FOLLOWED, MIN_TRAINER_CHANGE, ProbeReading, WeightSync, WeightSyncFailed, followed, kept_stale

PROBE = list(range(1, 9))  # token ids; the logprobs are of tokens 2..8
BASE = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.5, -0.2, -2.5])
NOISE = torch.tensor([0.05, -0.06, 0.04, -0.05, 0.06, -0.04, 0.05])  # a bf16 engine's disagreement, ~0.05


def test_followed_is_the_slope_of_the_engines_change_on_the_trainers():
    step = torch.tensor([0.1, -0.2, 0.05, 0.3, -0.1, 0.0, 0.2])
    before = ProbeReading(BASE + NOISE, BASE)
    moved = ProbeReading(BASE + step + NOISE, BASE + step)
    assert followed(before, moved) == (pytest.approx(step.abs().mean().item()), pytest.approx(1.0), pytest.approx(0.0, abs=1e-6))
    stale = ProbeReading(BASE + NOISE, BASE + step)
    assert followed(before, stale)[1:] == (pytest.approx(0.0), pytest.approx(0.0))
    halfway = ProbeReading(BASE + step / 2 + NOISE, BASE + step)
    assert followed(before, halfway)[1] == pytest.approx(0.5)
    tiny = ProbeReading(BASE + NOISE, BASE + MIN_TRAINER_CHANGE / 2)
    assert followed(before, tiny)[1:] == (None, None)  # too small a step to tell: only the gap is checked


def test_a_slope_under_the_bound_fails_only_when_the_engines_noise_cannot_explain_it():
    step = 0.02 * torch.tensor([1.0, -1.0, 0.5, 1.0, -0.5, 0.2, 1.0])
    before = ProbeReading(BASE + NOISE, BASE)
    # A bf16 engine that reloaded: its rounding noise changes with the weights, by as much as the step itself.
    renoised = ProbeReading(BASE + step + NOISE.roll(1), BASE + step)
    _, slope, error = followed(before, renoised)
    assert slope < MIN_FOLLOWED and error > 1 and not kept_stale(slope, error)  # a scattered slope says nothing
    # A stale engine repeats its logprobs exactly: slope 0, no scatter, stale however small the step.
    assert kept_stale(*followed(before, ProbeReading(BASE + NOISE, BASE + step))[1:])
    # Part of the way with little scatter is measurably stale too (a replica that loaded some tensors only).
    assert kept_stale(*followed(before, ProbeReading(BASE + 0.1 * step + NOISE + 0.001 * NOISE.flip(0), BASE + step))[1:])
    assert not kept_stale(None, None)


class Engine:
    """`replicas` engine replicas, each serving the policy's logprobs (plus bf16-like noise) as of its last reload;
    the replicas in `skip_reloads` keep their old ones."""

    def __init__(self, policy, replicas: int = 1):
        self.policy, self.weight_version, self.skip_reloads = policy, 0, set()
        self.served = [policy.current.clone() for _ in range(replicas)]

    async def reload_weights(self, directory: str) -> None:
        for replica in range(len(self.served)):
            if replica not in self.skip_reloads:
                self.served[replica] = self.policy.current.clone()
        self.weight_version += 1

    async def replica_prompt_logprobs(self, token_ids) -> dict[int, list[float]]:
        return {replica: (served + NOISE).tolist() for replica, served in enumerate(self.served)}


class Policy:
    """The trainer side: logprobs that each update moves by `step`."""

    def __init__(self):
        self.current = BASE.clone()
        self.causal_lm = SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=False))

    def merged_state_dict(self):
        yield "w", torch.zeros(2)

    def no_grad_logprobs(self, row, temperature: float = 1.0, weights_dtype: torch.dtype | None = None) -> torch.Tensor:
        assert weights_dtype == torch.bfloat16  # the trainer's side computes with the weights as the sync sent them
        return self.current.clone()


def syncs(steps: list[float], skip_from: int | None = None, replicas: int = 1, stale_replica: int = 0) -> list:
    """Sync after each update of the given sizes; replica `stale_replica` skips its reloads from update `skip_from` on."""
    policy = Policy()
    engine = Engine(policy, replicas)
    torch_thread = ThreadPoolExecutor(1)
    sync = WeightSync(engine, policy, PROBE, tolerance=0.15, engine_dtype="bfloat16", torch_thread=torch_thread)
    reports = []

    async def run():
        reports.append(await sync.sync())
        for index, size in enumerate(steps):
            policy.current = policy.current + size * torch.tensor([1.0, -1.0, 0.5, 1.0, -0.5, 0.2, 1.0])
            engine.skip_reloads = {stale_replica} if skip_from is not None and index >= skip_from else set()
            reports.append(await sync.sync())

    try:
        asyncio.run(run())
    finally:
        sync.close()
        torch_thread.shutdown()
    return reports


def test_syncs_that_reload_pass_and_report_the_engine_followed():
    reports = syncs([0.02, 0.01, 0.0])
    assert [r.probe_followed for r in reports[:3]] == [None, pytest.approx(1.0), pytest.approx(1.0)]
    assert reports[3].probe_followed is None and reports[3].probe_change == 0.0  # no change (a zero-lr control): nothing to follow
    assert all(r.probe_gap < 0.1 for r in reports)


def test_a_reload_that_keeps_stale_weights_stops_the_run_naming_the_probe():
    with pytest.raises(WeightSyncFailed, match=r"weight-sync probe: after loading weight version 3, the engine's logprobs moved 0\.00 ± 0\.00 of the way") as failure:
        syncs([0.02, 0.02], skip_from=1)
    assert "stale weights" in str(failure.value)
    # The gap alone would not have caught it: with stale weights it is still under the bf16 tolerance.
    stale = ProbeReading(BASE + 0.02 * torch.tensor([1.0, -1.0, 0.5, 1.0, -0.5, 0.2, 1.0]) + NOISE, BASE + 0.04 * torch.tensor([1.0, -1.0, 0.5, 1.0, -0.5, 0.2, 1.0]))
    assert stale.gap < 0.15


def test_every_replica_is_probed_and_one_left_on_stale_weights_is_named():
    reports = syncs([0.02, 0.01], replicas=2)
    assert [r.probe_replicas for r in reports] == [2, 2, 2] and reports[2].probe_followed == pytest.approx(1.0)
    with pytest.raises(WeightSyncFailed, match=r"after loading weight version 3, engine replica 1's logprobs moved 0\.00 ± 0\.00 of the way .* engine replica 1 kept stale weights"):
        syncs([0.02, 0.02], skip_from=1, replicas=2, stale_replica=1)
