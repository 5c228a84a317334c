"""RL over the API as an attacker would meet it: off unless the operator enables it, behind the admin key,
overrides bounded, files only from the data dir, one trainer at a time, rollouts inside admission. On a
scripted engine, with the trainer replaced (tests/integration/test_rl_live.py trains for real)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from rstar.config import load_settings
from rstar.server.engine import SamplingOptions, TokenDelta
from rstar.server.limits import Admission, AdmittedGenerations
from tests.scripted_engine import ScriptedEngine
from tests.scripted_sandbox import ScriptedSandbox

PROBLEMS = [{"problem": "What is 2+2?", "answer": "4"}, {"problem": "What is 3+3?", "answer": "6"}]


@pytest.fixture
def rl_server(tmp_path, default_tokenizer, monkeypatch):
    """Start the app with the RL routes mounted as `rstar serve` mounts them; yields (client, settings, trainers
    started). The trainer is a stand-in that runs until cancelled."""
    import rstar.rl.api as rl_api
    from rstar.app import build_app

    started = []

    async def trainer(env, spec, problems, store, prompt_tokens=None):
        started.append((env, spec))
        await asyncio.Event().wait()

    monkeypatch.setattr(rl_api, "train_grpo", trainer)
    opened = []

    def start(**overrides):
        settings = load_settings(data_dir=tmp_path / "data", **overrides)
        settings.data_dir.mkdir(exist_ok=True)
        (settings.data_dir / "problems.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
        engine = ScriptedEngine(default_tokenizer, ["4"], model_name="scripted")
        engine.model_path, engine.dtype = str(tmp_path), "float32"

        async def factory():
            return engine

        app = build_app(settings, factory, "scripted", sandbox_factory=ScriptedSandbox)
        client = TestClient(app, base_url="http://localhost")
        client.__enter__()
        opened.append(client)
        return client, settings, started

    yield start
    for client in opened:
        client.__exit__(None, None, None)


def _nothing_left(client, settings, headers=None) -> None:
    assert client.get("/v1/rl/runs", headers=headers).json()["data"] == []
    assert not (settings.data_dir / "rl_runs").exists()


def test_rl_routes_exist_only_when_the_operator_enables_them(rl_server):
    client, _, _ = rl_server()
    assert client.get("/v1/rl/runs").status_code == 404
    assert client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "problems.jsonl"}).status_code == 404


def test_rl_takes_the_admin_key_not_the_chat_key(rl_server):
    client, _, started = rl_server(enable_rl=True, api_key="chat", admin_key="admin")
    body = {"recipe": "cpu", "data": "problems.jsonl"}
    assert client.post("/v1/rl/runs", json=body, headers={"authorization": "Bearer chat"}).status_code == 401
    assert client.get("/v1/rl/runs", headers={"authorization": "Bearer chat"}).status_code == 401
    assert started == []
    assert client.post("/v1/rl/runs", json=body, headers={"authorization": "Bearer admin"}).status_code == 202
    assert len(started) == 1


@pytest.mark.parametrize(
    ("config", "knob", "says"),
    [
        ({"learning_rate": 1.0}, "learning_rate", "from 0 to 1e-05"),
        ({"prompts_per_step": 100000}, "prompts_per_step", "from 1 to 512"),
        ({"rollouts_per_prompt": "32"}, "rollouts_per_prompt", "must be a number"),
        ({"save_every": True}, "save_every", "must be a number"),
        ({"token_budget": 64}, "token_budget", "cannot be set over the API"),
        ({"lr": 1}, "lr", "unknown key"),
        ({"trainer_ranks": 64}, "trainer_ranks", "each rank needs one; use --trainer-ranks"),
        ({"lora_rank": 8}, "lora_rank", "serves LoRA adapters up to rank 0 (0: none); start the server with RSTAR_ENGINE__MAX_LORA_RANK=8"),
    ],
)
def test_an_override_out_of_bounds_is_a_400_naming_the_knob_and_starts_nothing(rl_server, config, knob, says):
    client, settings, started = rl_server(enable_rl=True)
    refused = client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "problems.jsonl", "config": config})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == f"config.{knob}" and says in error["message"], error
    assert started == []
    _nothing_left(client, settings)


def test_bounded_overrides_within_range_start_the_run_with_them(rl_server):
    client, _, started = rl_server(enable_rl=True)
    accepted = client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "problems.jsonl", "config": {"learning_rate": 2e-6, "prompts_per_step": 4}})
    assert accepted.status_code == 202, accepted.text
    (_, spec), = started
    assert spec.recipe.stage_config(0).learning_rate == 2e-6 and spec.recipe.stage_config(0).prompts_per_step == 4


def test_a_lora_run_starts_where_the_engine_serves_adapters_of_its_rank(rl_server):
    from rstar.config import EngineSettings

    client, _, started = rl_server(enable_rl=True, engine=EngineSettings(max_lora_rank=8))
    assert client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "problems.jsonl", "config": {"lora_rank": 16}}).json()["error"]["param"] == "config.lora_rank"
    accepted = client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "problems.jsonl", "config": {"lora_rank": 8}})
    assert accepted.status_code == 202, accepted.text
    (_, spec), = started
    assert spec.recipe.stage_config(0).lora_rank == 8


def test_files_must_be_regular_files_under_the_data_dir_and_run_ids_start_with_a_letter_or_digit(rl_server, tmp_path):
    client, settings, started = rl_server(enable_rl=True)
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps(PROBLEMS[0]) + "\n")
    (settings.data_dir / "link.jsonl").symlink_to(outside)
    (settings.data_dir / "adir").mkdir()
    os.mkfifo(settings.data_dir / "pipe.jsonl")
    refusals = [
        ({"data": "/dev/zero"}, "data"),
        ({"data": str(outside)}, "data"),
        ({"data": "link.jsonl"}, "data"),  # a link out of the data dir
        ({"data": "../outside.jsonl"}, "data"),
        ({"data": "adir"}, "data"),
        ({"data": "pipe.jsonl"}, "data"),  # would block a reader forever
        ({"data": "owner/dataset"}, "data"),  # a hub id: the server fetches nothing for a client
        ({"recipe": str(outside)}, "recipe"),
        ({"recipe": "/etc/passwd"}, "recipe"),
        ({"run_id": ".."}, "run_id"),
        ({"run_id": "."}, "run_id"),
        ({"run_id": "-x"}, "run_id"),
    ]
    for change, param in refusals:
        refused = client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "problems.jsonl"} | change)
        assert refused.status_code == 400, (change, refused.text)
        assert refused.json()["error"]["param"] == param, (change, refused.json())
    assert started == []
    _nothing_left(client, settings)


def test_two_starts_at_once_start_one_trainer(rl_server, monkeypatch):
    import rstar.rl.api as rl_api

    client, _, started = rl_server(enable_rl=True)
    load_problems = rl_api.load_problems

    def slow_load(source):  # both requests are between the one-run check and their task
        time.sleep(0.3)
        return load_problems(source)

    monkeypatch.setattr(rl_api, "load_problems", slow_load)
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda run_id: client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "problems.jsonl", "run_id": run_id}), ["a1", "a2"]))
    assert sorted(a.status_code for a in answers) == [202, 409], [a.text for a in answers]
    assert len(started) == 1
    assert [run["id"] for run in client.get("/v1/rl/runs").json()["data"]] == [started[0][1].run_id]


def test_a_run_list_limit_is_bounded(rl_server):
    client, _, _ = rl_server(enable_rl=True)
    for limit in (0, 201, -1):
        refused = client.get("/v1/rl/runs", params={"limit": limit})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "limit"


def test_rollouts_run_through_admission(rl_server):
    client, _, started = rl_server(enable_rl=True)
    assert client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "problems.jsonl"}).status_code == 202
    (env, _), = started
    assert isinstance(env.engine, AdmittedGenerations)


class _HeldEngine:
    """Generations that each emit one delta and then wait until released."""

    def __init__(self):
        self.release = asyncio.Event()
        self.running = 0
        self.tokenizer = "the engine's own"

    async def generate(self, prompt_ids, options, request_id=None):
        self.running += 1
        try:
            yield TokenDelta(token_ids=[1], text="x")
            await self.release.wait()
        finally:
            self.running -= 1


def test_rollouts_hold_at_most_their_share_and_api_requests_keep_the_rest():
    async def main():
        admission = Admission(max_running=4, max_waiting=4, wait_timeout_s=0.5, retry_after_s=1)
        engine = _HeldEngine()
        shared = AdmittedGenerations(engine, admission, share=2)
        assert shared.tokenizer == "the engine's own"  # everything but generate is the engine's
        async def rollout() -> int:
            return len([delta async for delta in shared.generate([1], SamplingOptions(max_tokens=4))])

        rollouts = [asyncio.create_task(rollout()) for _ in range(5)]
        await asyncio.sleep(0.1)
        assert (engine.running, admission.running) == (2, 2)  # five rollouts, two at a time
        async with admission.slots(2):  # an API request with n=2 is admitted at once beside them
            assert admission.running == 4
        engine.release.set()
        assert await asyncio.gather(*rollouts) == [1] * 5
        assert (engine.running, admission.running) == (0, 0)

    asyncio.run(main())


def test_a_recipe_whose_budget_does_not_fit_the_window_is_a_400_naming_both_numbers(rl_server):
    client, settings, started = rl_server(enable_rl=True)
    (settings.data_dir / "long.toml").write_text('name = "long"\n[[stages]]\nname = "s1"\nsteps = 1\nmax_response_tokens = 100\n[[stages]]\nname = "s2"\nsteps = 1\nmax_response_tokens = 4000\n')
    refused = client.post("/v1/rl/runs", json={"recipe": "long.toml", "data": "problems.jsonl"})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "recipe" and "max_response_tokens 4000" in error["message"] and "this server's context window of 2048" in error["message"], error
    assert started == []
    _nothing_left(client, settings)
