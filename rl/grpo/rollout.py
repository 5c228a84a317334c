"""Rollouts: every sample of a step generated at once through the server's own agent loop, then rewarded.

`run_trajectory` on the engine and sandbox that serve the API (no second engine, no HTTP hop) gives each
sample's token ids, response mask, rollout logprobs, weight version and tool records. The samples of one
problem share their prompt tokens, so the engine's prefix cache computes the prompt once per group.

Reward: 1 if the answer checks out by the config's rule (`reward`: `released` or `boxed`), else 0, graded
over the whole response text (tool turns included, special tokens skipped) by the sandbox's `verify`, under a
timeout; a check that hangs or fails scores 0 and is counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rstar.rl.data import Problem
from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.samples import Sample
from rstar.sandbox.clients import SandboxClient
from rstar.sandbox.tools import BUILTIN_TOOLS, PYTHON_TOOL
from rstar.sandbox.verify import RewardRule
from rstar.server.agent_loop import LoopConfig, run_trajectory
from rstar.server.builtin_tools import SandboxExecutor, builtin_tool_schemas
from rstar.server.chat_template import ChatTemplate
from rstar.server.engine import SamplingOptions, TokenEngine
from rstar.server.trajectory import Trajectory

TOOLS = builtin_tool_schemas([PYTHON_TOOL])
log = logging.getLogger("rstar.rl")


@dataclass(frozen=True)
class RolloutEnv:
    """What rollouts run on: the serving stack's engine, chat template and sandbox."""

    engine: TokenEngine
    template: ChatTemplate
    sandbox: SandboxClient


def prompt_messages(problem: Problem) -> list[dict]:
    return [{"role": "user", "content": problem.problem}]


def sample_seed(seed: int, step: int, problem_index: int, sample_index: int) -> int:
    """A per-sample sampling seed: the same run, step and position always draw the same sample."""
    digest = hashlib.sha256(f"{seed}/{step}/{problem_index}/{sample_index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def loop_config(config: GRPOConfig) -> LoopConfig:
    return LoopConfig(
        builtin_tools=BUILTIN_TOOLS if config.builtin_tools else frozenset(),
        max_turns=config.max_turns,
        max_response_tokens=config.max_response_tokens,
        max_parallel_calls=config.max_parallel_calls,
        tools=config.tool_settings(),
        logprobs=True,
    )


async def generate(env: RolloutEnv, problems: Sequence[Problem], samples_per_problem: int, config: GRPOConfig, seed: int, step: int) -> list[list[Trajectory]]:
    """`samples_per_problem` trajectories of each problem, all in flight at once; one list per problem."""
    executor = SandboxExecutor(env.sandbox, timeout_s=config.tool_timeout_s)
    loop = loop_config(config)

    async def one(problem_index: int, sample_index: int) -> Trajectory:
        sampling = SamplingOptions(
            max_tokens=config.max_response_tokens,  # the loop sets each turn's own from what is left
            temperature=config.temperature,
            top_p=config.top_p,
            seed=sample_seed(seed, step, problem_index, sample_index),
        )
        tools = TOOLS if config.builtin_tools else []
        return await run_trajectory(env.engine, env.template, prompt_messages(problems[problem_index]), tools, sampling, executor, loop)

    flat = await asyncio.gather(*(one(p, s) for p in range(len(problems)) for s in range(samples_per_problem)))
    return [list(flat[p * samples_per_problem : (p + 1) * samples_per_problem]) for p in range(len(problems))]


async def reward(env: RolloutEnv, problems: Sequence[Problem], groups: Sequence[Sequence[Trajectory]], timeout_s: float, rule: RewardRule) -> list[list[Sample]]:
    """Grade every trajectory against its problem's answer by `rule`, concurrently (the sandbox pool bounds the work)."""

    async def one(problem: Problem, trajectory: Trajectory) -> Sample:
        score, status = await grade(env, trajectory, problem.answer, timeout_s, rule)
        return Sample(problem, trajectory, score, status)

    graded = await asyncio.gather(*(one(problem, t) for problem, group in zip(problems, groups) for t in group))
    failed = Counter(sample.grade_status for sample in graded if sample.grade_status != "ok")
    if failed:  # scored 0: a check that hung or crashed must not look like a wrong answer silently
        log.warning("answer checks that did not finish (scored 0): %s", dict(failed))
    sizes = [len(group) for group in groups]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [list(graded[start : start + size]) for start, size in zip(starts, sizes)]


async def grade(env: RolloutEnv, trajectory: Trajectory, gold: str, timeout_s: float, rule: RewardRule) -> tuple[float, str]:
    """1.0 if the response's final answer matches `gold` by `rule`, else 0.0, checked in the sandbox under a timeout."""
    text = env.template.tokenizer.decode(trajectory.response_ids, skip_special_tokens=True)
    verdict = await env.sandbox.verify(text, gold, timeout_s, rule)
    return (1.0 if verdict.correct else 0.0), verdict.status
