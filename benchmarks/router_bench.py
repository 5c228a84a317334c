"""Two live CPU replicas of the default model behind the router: KV-aware vs least-requests vs round-robin.

One `ReplicatedEngine` (server/replicas.py: N engines as one TokenEngine) serves a skewed RL-step workload drawn
by `router_workload.make_workload` (the simulator's generator, scaled to this machine): short single-turn
answers and long multi-turn tool trajectories, all started at once as a rollout step starts them. Short ones are
plain `generate` calls of exactly the drawn length (EOS ignored); multi-turn ones run the real agent loop
(`run_trajectory`, as rl/grpo/rollout.py calls it) with the real sandbox, the drawn turns and token budget as limits,
on the tool-use problems of `rstar rl make-sft-data` (the rollouts of one problem share its prompt).

The policies take turns in rounds (the order rotates each round), each on the same workload, with the
replicas' prefix caches reset and a fresh router before each run. Per policy, over all its rounds: trajectory
latency p50/p95 and generated tokens per second. Goal: KV-aware p95 <= 0.8x least-requests' at
equal throughput.

    flock /tmp/rstar-engine.lock python benchmarks/router_bench.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from goals import write_report  # noqa: E402
from router_workload import LIVE_SHAPE, TrajectorySpec, WorkloadShape, describe, goals, make_workload, summarize  # noqa: E402
from tool_use_bench import heldout_problems  # noqa: E402

from rstar.config import EngineSettings, load_settings  # noqa: E402
from rstar.hardware import cpu_info  # noqa: E402
from rstar.rl.data import Problem, problem_from_row  # noqa: E402
from rstar.rl.grpo.config import GRPOConfig  # noqa: E402
from rstar.rl.grpo.rollout import TOOLS, loop_config, prompt_messages, sample_seed  # noqa: E402
from rstar.server.agent_loop import run_trajectory  # noqa: E402
from rstar.server.builtin_tools import SandboxExecutor  # noqa: E402
from rstar.server.chat_template import ChatTemplate, choose_template  # noqa: E402
from rstar.server.engine import SamplingOptions, TokenEngine  # noqa: E402
from rstar.server.model_store import resolve_model  # noqa: E402
from rstar.server.routing import POLICIES, Policy, Router  # noqa: E402

REPLICAS = 2
MODEL = "default"  # the base model plus the shipped tool-use delta: it calls its tool
ENGINE_SETTINGS = EngineSettings(max_model_len=2048, max_num_seqs=64)  # as engine_costs.py measured them
QUICK_SHAPE = replace(LIVE_SHAPE, prompts=2)


async def start_replicated_engine(model_dir: str, served_model_name: str) -> TokenEngine:
    """Two local replicas, one core each, as `rstar serve --replicas 2` starts them."""
    from rstar.server.ray_replicas import start_ray_replicas

    return await start_ray_replicas(model_dir, ENGINE_SETTINGS.model_copy(update={"replicas": REPLICAS}), served_model_name)


async def use_policy(engine, policy: Policy) -> None:
    """A fresh router of this policy and empty prefix caches, so no run inherits another's state."""
    engine.router = Router(REPLICAS, policy, max_in_flight=ENGINE_SETTINGS.max_num_seqs)
    await engine.reset_prefix_cache()


async def run_one(engine: TokenEngine, template: ChatTemplate, executor: SandboxExecutor, spec: TrajectorySpec, problem: Problem, seed: int) -> tuple[float, int, int]:
    """One trajectory of the step: its latency from the step's start, sampled tokens and tool calls."""
    started = time.perf_counter()
    messages = prompt_messages(problem)
    sampling = SamplingOptions(max_tokens=spec.response_tokens, temperature=1.0, seed=sample_seed(seed, 0, spec.group, spec.uid))
    if spec.tool_calls == 0:  # a short answer: exactly the drawn length
        prompt_ids = template.encode(messages, [], add_generation_prompt=True)
        options = replace(sampling, max_tokens=spec.generated_tokens, ignore_eos=True)
        sampled = sum([len(delta.token_ids) async for delta in engine.generate(prompt_ids, options)])
        return time.perf_counter() - started, sampled, 0
    config = GRPOConfig(max_turns=len(spec.turns), max_response_tokens=spec.response_tokens)
    trajectory = await run_trajectory(engine, template, messages, TOOLS, sampling, executor, loop_config(config))
    return time.perf_counter() - started, sum(trajectory.response_mask), len(trajectory.tool_calls)


async def run_step(engine, template, executor, specs, problems, seed) -> dict:
    started = time.perf_counter()
    results = await asyncio.gather(*(run_one(engine, template, executor, spec, problems[spec.group % len(problems)], seed) for spec in specs))
    wall = time.perf_counter() - started
    latencies = [latency for latency, _, _ in results]
    return summarize(latencies, sum(tokens for _, tokens, _ in results), wall) | {
        "latencies_s": latencies,
        "tool_calls": sum(calls for _, _, calls in results),
    }


async def measure(shape: WorkloadShape, rounds: int) -> dict:
    from rstar.sandbox.clients import LocalClient
    from rstar.sandbox.settings import SandboxSettings

    settings = load_settings()
    model = resolve_model(MODEL, settings.models_dir)
    rows, problems_path = heldout_problems(None, shape.prompts)
    problems = [problem_from_row(row, f"{problems_path}:{index + 1}") for index, row in enumerate(rows)]
    specs = make_workload(shape, seed=0)
    engine = await start_replicated_engine(model.path, model.name)
    runs: dict[str, list[dict]] = {policy: [] for policy in POLICIES}
    try:
        template = choose_template(engine.tokenizer, model.name, settings.api.chat_template)  # as `rstar rl train`
        async with LocalClient(SandboxSettings(uid_base=65300)) as sandbox:
            executor = SandboxExecutor(sandbox, timeout_s=GRPOConfig().tool_timeout_s)
            await run_step(engine, template, executor, specs[: shape.rollouts], problems, seed=99)  # warm-up
            for round_index in range(rounds):
                order = POLICIES[round_index % 3 :] + POLICIES[: round_index % 3]
                for policy in order:
                    await use_policy(engine, policy)
                    run = await run_step(engine, template, executor, specs, problems, seed=round_index)
                    runs[policy].append(run)
                    print(f"round {round_index + 1}/{rounds} {policy:<14} p50 {run['latency_p50_s']:6.1f} s  p95 {run['latency_p95_s']:6.1f} s  "
                          f"{run['throughput_tok_s']:6.1f} tok/s  {run['tool_calls']} tool calls", flush=True)
    finally:
        await engine.shutdown()
    pooled = {
        policy: summarize([latency for run in mine for latency in run["latencies_s"]], sum(run["generated_tokens"] for run in mine), sum(run["wall_s"] for run in mine))
        for policy, mine in runs.items()
    }
    return {"model": model.name, "problems": problems_path, "engine_settings": ENGINE_SETTINGS.model_dump(), "replicas": REPLICAS,
            "workload": shape.to_dict(), "workload_figures": describe(specs), "rounds": rounds, "runs": runs, "per_policy": pooled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 problems x 8 rollouts, one round")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/router_bench.json"))
    args = parser.parse_args()
    measured = asyncio.run(measure(QUICK_SHAPE if args.quick else LIVE_SHAPE, rounds=1 if args.quick else 3))
    result = {
        "benchmark": "router_bench",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_info().to_dict(),
        "quick": args.quick,
        **measured,
        "goals": goals(measured["per_policy"]),
    }
    print(json.dumps({"per_policy": result["per_policy"]}, indent=2))
    write_report(args.out, result)


if __name__ == "__main__":
    main()
