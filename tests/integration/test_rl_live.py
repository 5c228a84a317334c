"""rl/ on the real default model, engine and sandbox: GRPO steps change the weights and the engine serves
them (the probe passes), a run started over the API trains the serving engine while it keeps answering,
a `kill -9` mid-run resumes from its checkpoint counting nothing twice, and a short SFT lowers the loss."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
import torch
from safetensors.torch import load_file

from rstar.orphan_guard import shared_memory_used
from rstar.rl.data import Problem
from rstar.rl.grpo.recipe import parse_recipe
from rstar.rl.grpo.rollout import RolloutEnv
from rstar.rl.grpo.sharded_checkpoint import SHARDED_DIR
from rstar.rl.grpo.train import RunSpec, train_grpo
from rstar.rl.grpo.weight_sync import WeightSyncFailed, kept_stale
from rstar.rl.runs import RunStore
from rstar.sandbox.clients import LocalClient
from rstar.sandbox.settings import SandboxSettings
from rstar.server.chat_template import rstar_template
from rstar.server.db import open_database
from tests.processes import remove_orphaned_shared_memory
from tests.waiting import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]

# Workloads sized in tokens, as the eval tests are: a step of TINY samples 4 problems x 4 answers of at most 200
# tokens in at most 2 turns (3,200 sampled tokens at most) and trains on at most 2 x 4 of them. The trainer and
# the engine run fp32 on CPUs without native bf16, about 3x slower than bf16 where it is native, so every step a
# test adds costs minutes on the slowest machine kind: each test runs the fewest steps that show its point.
# A 135M model sampled at temperature 1 gets some of these right and some wrong, which is what GRPO needs.
TINY = {
    "name": "tiny",
    "config": {
        "prompts_per_step": 4, "rollouts_per_prompt": 4, "keep_per_prompt": 2, "min_positive_traces": 1, "min_negative_traces": 1,
        "learning_rate": 1e-4, "warmup_steps": 0, "token_budget": 1024, "save_every": 1,  # 1024: small activations, so two trainers and two engines fit in 24 GB
    },
    "stages": [{"name": "tiny", "steps": 2, "max_response_tokens": 200, "max_turns": 2}],
}


def tiny(steps: int, prompts_per_step: int = 4, max_response_tokens: int = 200) -> dict:
    """TINY with fewer steps, problems per step or tokens per answer (for tests whose point is not what a step learns)."""
    return TINY | {
        "config": TINY["config"] | {"prompts_per_step": prompts_per_step},
        "stages": [{"name": "tiny", "steps": steps, "max_response_tokens": max_response_tokens, "max_turns": 2}],
    }


PROBLEMS = [
    ("What is 4821 times 937?", "4517277"), ("What is 123456 modulo 97?", str(123456 % 97)),
    ("What is the sum of the integers from 17 to 2024?", str(sum(range(17, 2025)))), ("How many positive divisors does 5040 have?", "60"),
    ("What is 7 to the power 123 modulo 1000?", str(pow(7, 123, 1000))), ("What is 98765 times 4321?", str(98765 * 4321)),
    ("Compute 1^2 + 2^2 + ... + 300^2.", str(sum(k * k for k in range(301)))), ("What is 2 to the power 40?", str(2**40)),
]


def write_problems(path: Path) -> Path:
    path.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a in PROBLEMS))
    return path


def test_two_grpo_steps_train_the_weights_the_engine_then_serves(engine, loop_thread, default_model_dir, tmp_path, restore_engine_weights):
    store = RunStore(open_database(f"sqlite:///{tmp_path / 'rstar.db'}"))
    recipe = parse_recipe(TINY, "tiny")
    spec = RunSpec("two-steps", tmp_path / "run", recipe, default_model_dir, "inline", engine.dtype)
    problems = [Problem(str(i), p, a) for i, (p, a) in enumerate(PROBLEMS)]
    version = engine.weight_version

    async def go():
        async with LocalClient(SandboxSettings(uid_base=64600)) as sandbox:
            return await train_grpo(RolloutEnv(engine, rstar_template(engine.tokenizer), sandbox), spec, problems, store)

    assert loop_thread.run(go(), timeout=900) == "finished"
    run = store.get("two-steps")
    assert run["status"] == "finished" and [s["step"] for s in run["steps"]] == [1, 2]
    trained = [s for s in run["steps"] if s["trained"]]
    assert trained, f"no step had a group with mixed rewards: {[(s['reward_mean'], s['groups_dropped_equal']) for s in run['steps']]}"
    for step in trained:
        assert step["probe_gap"] < 0.15  # the engine's logprobs match the trainer's new weights
        assert step["train_tokens"] > 0 and step["grad_norm"] > 0
        # Where the probe could compare with the last sync, the engine moved with the trainer.
        assert step["probe_followed"] is None or not kept_stale(step["probe_followed"], step["probe_followed_error"]), step
    resynced = version > 0  # an engine an earlier test retrained is first given the run's start weights
    assert engine.weight_version == version + resynced + len(trained)
    assert run["steps"][-1]["tool_call_rate"] > 0  # the tuned default model calls its tool

    base = load_file(str(default_model_dir / "model.safetensors"))
    final = load_file(str(tmp_path / "run" / "checkpoint-2" / "model.safetensors"))
    changed = sum(not torch.equal(base[name].float(), final[name].float()) for name in base)
    assert changed > len(base) // 2
    assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000


class StaleReloads:
    """The session engine with a fault: reloads bump the weight version and load nothing."""

    def __init__(self, engine):
        self.engine, self.weight_version = engine, engine.weight_version

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def reload_weights(self, weights_dir) -> None:
        self.weight_version += 1


def test_a_reload_that_keeps_stale_weights_stops_the_run_naming_the_probe(engine, loop_thread, default_model_dir, base_model_dir, tmp_path, restore_engine_weights):
    """The engine serves other weights (the untuned base) when a run starts on the default model, so the run's
    first sync must load its start weights; a reload that loads nothing is caught by the probe on that sync,
    before any rollout. The same sync and probe follow every training step (the unit tests show the check that
    the engine followed a small step, which the gap alone can miss in bf16)."""
    loop_thread.run(engine.reload_weights(base_model_dir))
    store = RunStore(open_database(f"sqlite:///{tmp_path / 'rstar.db'}"))
    spec = RunSpec("stale", tmp_path / "run", parse_recipe(TINY, "tiny"), default_model_dir, "inline", engine.dtype)
    problems = [Problem(str(i), p, a) for i, (p, a) in enumerate(PROBLEMS)]

    async def go():
        async with LocalClient(SandboxSettings(uid_base=64600)) as sandbox:
            return await train_grpo(RolloutEnv(StaleReloads(engine), rstar_template(engine.tokenizer), sandbox), spec, problems, store)

    with pytest.raises(WeightSyncFailed, match="weight-sync probe: after loading weight version .* is not serving the trained weights"):
        loop_thread.run(go(), timeout=900)
    run = store.get("stale")
    assert run["status"] == "failed" and "weight-sync probe" in run["error"] and run["steps"] == [], run


def test_a_run_over_the_api_trains_the_serving_engine_while_it_answers(live_server, restore_engine_weights):
    """On two sharded trainer ranks (gloo), as a user past one device would ask for; the one-rank path is the
    tests above."""
    data = write_problems(live_server.settings.data_dir / "problems.jsonl")
    recipe = live_server.settings.data_dir / "tiny.toml"
    # One step of two problems shows the engine trained while it answers; whether the step learned is not the point.
    recipe.write_text(toml_text(tiny(steps=1, prompts_per_step=2, max_response_tokens=128)))
    with httpx.Client(base_url=live_server.base_url, timeout=120) as client:
        started = client.post("/v1/rl/runs", json={"recipe": str(recipe), "data": str(data), "run_id": "api-run", "config": {"trainer_ranks": 2}})
        assert started.status_code == 202, started.text
        assert started.json()["status"] == "running"
        second = client.post("/v1/rl/runs", json={"recipe": str(recipe), "data": str(data), "run_id": "api-run-2"})
        assert second.status_code == 409 and second.json()["error"]["code"] == "run_in_progress"

        # The API keeps answering during the run, and says which weights answered.
        fingerprints = set()
        deadline = time.time() + 600
        while time.time() < deadline:
            reply = client.post("/v1/chat/completions", json={"model": "default", "messages": [{"role": "user", "content": "What is 6 times 7?"}], "max_tokens": 40, "temperature": 0})
            assert reply.status_code == 200
            fingerprints.add(reply.json()["system_fingerprint"])
            run = client.get("/v1/rl/runs/api-run").json()
            if run["status"] != "running":
                break
            time.sleep(1)
        assert run["status"] == "finished", run
        assert [s["step"] for s in run["steps"]] == [1]
        assert all(f.startswith("rstar-weights-v") for f in fingerprints)
        # Both ranks wrote their own shards of the weights and AdamW's moments into the step's checkpoint.
        [checkpoint] = run["checkpoints"]
        assert sorted(p.name for p in (Path(checkpoint["path"]) / SHARDED_DIR).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
        listed = client.get("/v1/rl/runs").json()["data"]
        assert "api-run" in [r["id"] for r in listed]
        assert client.get("/v1/rl/runs/nope").status_code == 404


def test_api_refuses_bad_requests_with_openai_errors(live_server):
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        outside = client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "/etc/passwd"})
        assert outside.status_code == 400 and "outside the directories" in outside.json()["error"]["message"]
        bad_recipe = client.post("/v1/rl/runs", json={"recipe": "no-such-recipe", "data": "x.jsonl"})
        assert bad_recipe.status_code == 400 and bad_recipe.json()["error"]["param"] == "recipe"
        missing = client.post("/v1/rl/runs", json={"recipe": "cpu", "data": str(live_server.settings.data_dir / "none.jsonl")})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "data"
        unknown_key = client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "x.jsonl", "config": {"lr": 1}})
        assert unknown_key.status_code == 400 and "lr: unknown key" in unknown_key.json()["error"]["message"]


def toml_text(recipe: dict) -> str:
    lines = [f'name = "{recipe["name"]}"', "[config]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in recipe["config"].items()]
    for stage in recipe["stages"]:
        lines.append("[[stages]]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in stage.items()]
    return "\n".join(lines) + "\n"


def run_steps(db: Path, run_id: str) -> list[int]:
    with sqlite3.connect(db) as connection:
        return [row[0] for row in connection.execute("select step from rl_steps where run_id = ? order by step", (run_id,))]


def describe(processes: list[psutil.Process]) -> list[str]:
    """What a failure message needs of each process: its state and where it hangs now."""
    described = []
    for process in processes:
        try:
            described.append(f"{process.pid} {process.name()} {process.status()} parent {process.ppid()}")
        except psutil.NoSuchProcess:
            described.append(f"{process.pid} gone")
    return described


def engine_socket_dirs(pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"rstar-engine-ipc-{pid}-*"))


def test_a_killed_run_resumes_from_its_checkpoint_counting_nothing_twice(tmp_path):
    """`rstar rl train` on two sharded trainer ranks in its own process (its own engine), killed with SIGKILL
    after its first checkpoint, then the same command: it finishes from that checkpoint, on both ranks' shards,
    and every step is stored exactly once."""
    recipe = tmp_path / "tiny.toml"
    # Two problems a step: what is under test is the kill and the resume, not what the steps learn.
    recipe.write_text(toml_text(tiny(steps=2, prompts_per_step=2, max_response_tokens=96)))
    data = write_problems(tmp_path / "problems.jsonl")
    db = tmp_path / "rstar.db"
    env = {**os.environ, "RSTAR_DATA_DIR": str(tmp_path / "data"), "RSTAR_DATABASE_URL": f"sqlite:///{db}",
           "RSTAR_ENGINE__MAX_MODEL_LEN": "2048", "RSTAR_ENGINE__ENFORCE_EAGER": "true", "RSTAR_SANDBOX__UID_BASE": "64800", "COLUMNS": "200"}
    command = [sys.executable, "-m", "rstar.cli", "rl", "train", str(recipe), "--data", str(data), "--run-id", "killed", "--trainer-ranks", "2"]
    started = time.time()
    # Its log in a file, not a pipe: a pipe nobody reads fills and stalls every process writing to it.
    first_log = tmp_path / "first.log"
    with first_log.open("w") as log:
        first = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    run_dir = tmp_path / "data" / "rl_runs" / "killed"
    try:
        deadline = time.time() + 600
        while not (run_dir / "checkpoint-1").exists():
            assert first.poll() is None, first_log.read_text()[-3000:]
            assert time.time() < deadline, "no checkpoint in 10 minutes"
            time.sleep(0.5)
        children = psutil.Process(first.pid).children(recursive=True)
        engine_processes = [p for p in children if p.name().startswith("VLLM::")]
        rank_processes = [p for p in children if "spawn_main" in " ".join(p.cmdline())]  # rank 1, spawned by torch.multiprocessing
        segments = {name for name in shared_memory_used(p.pid for p in engine_processes) if name.startswith("psm_")}
        guards = [p for p in children if "rstar.orphan_guard" in p.cmdline()]
        assert engine_processes and segments and len(rank_processes) == 1 and guards, [p.cmdline() for p in children]
        os.kill(first.pid, signal.SIGKILL)  # rank 0 alone, as the OOM killer picks one process
        # Its orphan guard kills its engine processes and the other rank, then unlinks the engine's shared memory
        # (RAM the next run needs).
        _, left = psutil.wait_procs(engine_processes + rank_processes, timeout=30)
        assert not left, (f"the killed trainer's engine processes or rank outlived it: {describe(left)};"
                          f" its guard: {describe(guards)}; its log ends: {first_log.read_text()[-2000:]}")
        wait_for(lambda: not any((Path("/dev/shm") / name).exists() for name in segments), timeout_s=10,
                 failure="the killed engine's shared memory stayed in /dev/shm")
        wait_for(lambda: f"rstar orphan guard: process {first.pid} ended; killed what it left" in first_log.read_text(), timeout_s=15,
                 failure="the guard did not say what it killed")
        # A killed process cannot remove its temp dirs: the next engine start does (process_temp)
        assert len(engine_socket_dirs(first.pid)) == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)  # whatever is left of the first run, should the guard have failed
        first.wait(60)
        remove_orphaned_shared_memory(started)  # should the guard have failed, before the second run needs the memory
    before = run_steps(db, "killed")
    assert before == [1], f"the run was killed after {before}, not after its first step"
    checkpointed = json.loads((run_dir / "checkpoint-1" / "trainer_state.json").read_text())
    assert checkpointed["step"] == 1 and checkpointed["data_cursor"] == 2

    second = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = second.communicate(timeout=900)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(second.pid, signal.SIGKILL)  # on a timeout, its engine processes too, not the trainer alone
    assert second.returncode == 0, stderr[-3000:]
    assert "killed: finished" in stdout
    assert engine_socket_dirs(first.pid) == engine_socket_dirs(second.pid) == []
    assert run_steps(db, "killed") == [1, 2]
    with sqlite3.connect(db) as connection:
        status, step = connection.execute("select status, step from rl_runs where id = 'killed'").fetchone()
    assert (status, step) == ("finished", 2)
    state = json.loads((run_dir / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["data_cursor"] == 4  # 2 steps x 2 problems, none taken twice
    assert sorted(p.name for p in (run_dir / "checkpoint-2" / SHARDED_DIR).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def test_a_short_sft_lowers_the_loss_on_the_real_model(base_model_dir, tmp_path):
    from rstar.rl.sft.train import SFTConfig, SFTSpec, train_sft
    from rstar.rl.sft.data import build_conversations, generate_problems
    from rstar.rl.sft.encoding import encode_conversation
    from rstar.server.builtin_tools import SandboxExecutor
    from transformers import AutoTokenizer

    async def conversations():
        async with LocalClient(SandboxSettings(uid_base=64700)) as sandbox:
            return await build_conversations(generate_problems(5, 4, "train"), SandboxExecutor(sandbox))

    examples = asyncio.run(conversations())
    template = rstar_template(AutoTokenizer.from_pretrained(base_model_dir))
    encoded = [encode_conversation(template, example.messages) for example in examples]
    store = RunStore(open_database(f"sqlite:///{tmp_path / 'rstar.db'}"))
    # Four conversations seen four times: the trainer is fp32 where bf16 is not native, and every token costs there.
    config = SFTConfig(epochs=4, examples_per_step=4, learning_rate=2e-3, warmup_ratio=0, lora_rank=4, lora_alpha=8, save_every=2, token_budget=1024)
    spec = SFTSpec("short-sft", tmp_path / "run", base_model_dir, "inline")
    assert train_sft(spec, config, encoded, store) == "finished"
    losses = [s["loss"] for s in store.get("short-sft")["steps"]]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses
    assert (tmp_path / "run" / "delta.safetensors").stat().st_size < 10_000_000
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
