"""Unit-tier fixtures. Sandbox fixtures start real zygotes inside bubblewrap (about a second each)."""

from __future__ import annotations

import os
import time

import pytest

from tests.loop_thread import LoopThread

# The adversarial tests look for this in every place a cell could read the service's environment.
SANDBOX_CANARY = "rstar-sandbox-canary-7f3a"
os.environ["SANDBOX_TEST_CANARY"] = SANDBOX_CANARY


class SyncPool:
    """A SandboxPool driven from synchronous tests through its own event loop thread."""

    def __init__(self, settings) -> None:
        from rstar.sandbox.pool import SandboxPool

        self.loop_thread = LoopThread()
        self.pool = SandboxPool(settings)
        self.call(self.pool.start())

    def call(self, coro, timeout: float = 120):
        return self.loop_thread.run(coro, timeout)

    def run(self, code: str = "", **fields):
        return self.call(self.pool.run({"code": code, **fields}))

    def batch(self, requests: list):
        return self.call(self.pool.run_batch(requests))

    def settled_processes(self, timeout: float = 5.0) -> list[dict]:
        """Cell-uid processes once killed ones have exited (SIGKILL is not instantaneous) and every used slot
        has its spare back (the forker makes replacements as slots free up)."""
        settings = self.pool.settings
        deadline = time.monotonic() + timeout
        while True:
            table = self.call(self.pool.processes())
            spares = sum(p["role"] == "spare" for p in table)
            settled = all(p["role"] in ("spare", "session") for p in table)
            if (settled and spares == settings.workers + settings.spare_cells) or time.monotonic() > deadline:
                return table
            time.sleep(0.05)

    def close(self) -> None:
        self.call(self.pool.close())
        self.loop_thread.close()


@pytest.fixture(scope="session")
def sandbox_settings():
    from rstar.sandbox.settings import SandboxSettings

    # Each test pool has its own cell uids, apart from the default range (61000+) that servers started in
    # the same session use, so counting host processes by uid sees only this pool's.
    return SandboxSettings(workers=2, timeout_s=2.0, max_processes=16, max_sessions=4, uid_base=63000)


@pytest.fixture(scope="session")
def sandbox_pool(sandbox_settings):
    pool = SyncPool(sandbox_settings)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def sandbox_small_pool():
    """One worker and tight caps, for the limits that need small numbers to be reached quickly."""
    from rstar.sandbox.settings import SandboxSettings

    settings = SandboxSettings(workers=1, spare_cells=1, timeout_s=2.0, max_output_chars=50, max_output_bytes=20_000,
                               max_queue=2, queue_timeout_s=1.0, max_sessions=2, session_ttl_s=1.0,
                               max_code_chars=1000, preload=["numpy"], uid_base=64000)
    pool = SyncPool(settings)
    yield pool
    pool.close()


def sandbox_host_processes(uid_base: int, count: int) -> list[int]:
    """Host pids running as any cell uid (they should exist only while a pool is up)."""
    from rstar.sandbox.procs import cell_processes

    return [pid for pid, _uid, _state in cell_processes(uid_base, count)]


@pytest.fixture
def sandbox_host_processes_fn():
    return sandbox_host_processes


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A two-layer Llama of random weights (vocabulary 64, tied embeddings), saved as a model dir: the trainer's
    tests run on it in seconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory
