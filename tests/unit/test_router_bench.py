"""The live router benchmark's step and policy switch, on the scripted engine (no replicas needed)."""

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from router_bench import run_step, use_policy  # noqa: E402
from router_workload import TrajectorySpec, Turn  # noqa: E402

from rstar.rl.data import Problem  # noqa: E402
from rstar.sandbox.schemas import RunResult  # noqa: E402
from rstar.server.chat_template import choose_template  # noqa: E402
from tests.scripted_engine import ScriptedEngine  # noqa: E402

PROBLEM = Problem(id="p", problem="What is 6 * 7?", answer="42")
CALL = "<tool_call>\n" + json.dumps({"name": "python_code_with_standard_io", "arguments": {"code": "print(6 * 7)", "input": ""}}) + "\n</tool_call>"


class Executor:
    def __init__(self):
        self.calls = []

    async def execute(self, tool, code, stdin, replay, protocol="improved"):
        self.calls.append(code)
        return RunResult(status="ok", exit_code=0, stdout="42\n", duration_s=0.01)


def test_a_short_answer_is_exactly_its_drawn_length(default_tokenizer):
    engine = ScriptedEngine(default_tokenizer, [[42] * 50])
    template = choose_template(default_tokenizer, "SmolLM2-135M-Instruct")
    spec = TrajectorySpec(uid=0, group=0, problem_tokens=0, turns=(Turn(7),))
    run = asyncio.run(run_step(engine, template, Executor(), [spec], [PROBLEM], seed=0))
    assert run["generated_tokens"] == 7 and run["tool_calls"] == 0 and run["trajectories"] == 1
    assert engine.sampling[0].max_tokens == 7 and engine.sampling[0].ignore_eos


def test_a_multi_turn_trajectory_runs_the_agent_loop_with_its_drawn_limits(default_tokenizer):
    replies = ["Let me compute.\n" + CALL, "It is 42.</reason>\n<answer>\\boxed{42}</answer>"]
    engine = ScriptedEngine(default_tokenizer, replies)
    template = choose_template(default_tokenizer, "SmolLM2-135M-Instruct")
    executor = Executor()
    spec = TrajectorySpec(uid=0, group=0, problem_tokens=0, turns=(Turn(100, 30), Turn(100)))
    run = asyncio.run(run_step(engine, template, executor, [spec], [PROBLEM], seed=0))
    assert executor.calls == ["print(6 * 7)"] and run["tool_calls"] == 1
    sampled = sum(len(default_tokenizer.encode(reply, add_special_tokens=False)) + 1 for reply in replies)  # + turn ends
    assert run["generated_tokens"] == sampled
    assert engine.sampling[0].max_tokens <= spec.response_tokens  # the loop's budget is the drawn one


class FakeReplicated:
    def __init__(self):
        self.router, self.resets = None, 0

    async def reset_prefix_cache(self):
        self.resets += 1


def test_each_policy_run_gets_a_fresh_router_and_empty_caches():
    engine = FakeReplicated()
    asyncio.run(use_policy(engine, "least_requests"))
    first = engine.router
    asyncio.run(use_policy(engine, "least_requests"))
    assert engine.router.policy == "least_requests" and engine.router is not first
    assert engine.router.replicas == 2 and engine.resets == 2
