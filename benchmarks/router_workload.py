"""The router benchmarks' shared pieces: the skewed multi-turn workload of an RL step, and the per-policy report.

Both `router_sim.py` (the simulator) and `router_bench.py` (two live CPU replicas) draw their trajectories here
and summarise them with the same `summarize` / `goals`, so a simulated and a live figure mean the same thing.

The workload follows rStar2-Agent's stage-1 RL step (figures from `/work/shared/reference/rstar.md`: §3 "Batch"
512 prompts x 32 rollouts, §3 "Stages" 8K response budget with the mean response growing from ~1K to ~4K tokens,
§1 "Turn limits" T = 10 turns in stages 1-2, §2 up to 45K tool calls per step, i.e. at most 45,000 / 16,384 = 2.75
per trajectory, at ~0.3 s each). What the report does not give, and is an assumption here: the shape of the
length distribution (log-normal, sigma 1: many short answers, a long tail of long ones), that longer trajectories
make proportionally more tool calls, and the token counts of the shared system prompt, a problem and a tool
response (the released loop cuts tool output to 256 characters, §1, so tens of tokens).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from goals import goal


@dataclass(frozen=True)
class WorkloadShape:
    prompts: int = 512
    rollouts: int = 32  # per prompt; the rollouts of one prompt share its prompt tokens
    system_tokens: int = 320  # assumption: instruction + tool schema, shared by every request
    problem_tokens: tuple[int, int] = (40, 240)  # assumption: uniform range
    mean_response_tokens: float = 2500.0  # within stage 1's ~1K -> ~4K
    response_sigma: float = 1.0  # assumption: log-normal skew
    max_response_tokens: int = 8192  # stage 1's budget: sampled + tool tokens of all turns
    max_turns: int = 10
    mean_tool_calls: float = 2.75
    tool_response_tokens: tuple[int, int] = (30, 100)  # assumption: a <=256-character tool result, templated

    def to_dict(self) -> dict:
        return asdict(self)


# Two 1-core CPU replicas of the default model (router_bench.py, and router_sim.py's CPU counterpart of it): a
# step of a few minutes, every context within the engines' max_model_len of 2048.
LIVE_SHAPE = WorkloadShape(prompts=4, rollouts=8, mean_response_tokens=300, max_response_tokens=1024, max_turns=4)


@dataclass(frozen=True)
class Turn:
    generated: int  # tokens the model samples in this turn
    tool_response: int = 0  # tokens of the tool result that follows it (0: the last turn, no call)


@dataclass(frozen=True)
class TrajectorySpec:
    uid: int
    group: int  # the prompt it samples; the rollouts of a group share its prompt
    problem_tokens: int
    turns: tuple[Turn, ...]

    @property
    def tool_calls(self) -> int:
        return len(self.turns) - 1

    @property
    def generated_tokens(self) -> int:
        return sum(turn.generated for turn in self.turns)

    @property
    def response_tokens(self) -> int:
        return sum(turn.generated + turn.tool_response for turn in self.turns)


def make_workload(shape: WorkloadShape, seed: int) -> list[TrajectorySpec]:
    """Every trajectory of one step, `shape.rollouts` per prompt, deterministic in `seed`."""
    rng = random.Random(seed)
    sigma = shape.response_sigma
    mu = math.log(shape.mean_response_tokens) - sigma * sigma / 2  # so that the untruncated mean is the mean asked
    specs: list[TrajectorySpec] = []
    for group in range(shape.prompts):
        problem_tokens = rng.randint(*shape.problem_tokens)
        for _ in range(shape.rollouts):
            budget = max(1, min(shape.max_response_tokens, round(rng.lognormvariate(mu, sigma))))
            calls = min(shape.max_turns - 1, poisson(rng, shape.mean_tool_calls * budget / shape.mean_response_tokens))
            tool_tokens = [rng.randint(*shape.tool_response_tokens) for _ in range(calls)]
            while calls and budget - sum(tool_tokens) < calls + 1:  # too short for that many turns: fewer calls
                calls -= 1
                tool_tokens.pop()
            generated = split(rng, budget - sum(tool_tokens), calls + 1)
            turns = tuple(Turn(g, t) for g, t in zip(generated, tool_tokens + [0]))
            specs.append(TrajectorySpec(uid=len(specs), group=group, problem_tokens=problem_tokens, turns=turns))
    return specs


def poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method; the means here are small (a few tool calls)."""
    limit, product, count = math.exp(-mean), rng.random(), 0
    while product > limit:
        product *= rng.random()
        count += 1
    return count


def split(rng: random.Random, total: int, parts: int) -> list[int]:
    """`total` as `parts` positive integers in uniformly random proportions (a flat Dirichlet)."""
    weights = [rng.expovariate(1.0) for _ in range(parts)]
    scale = (total - parts) / sum(weights)
    sizes = [1 + int(weight * scale) for weight in weights]
    sizes[rng.randrange(parts)] += total - sum(sizes)  # what flooring left over
    return sizes


def describe(specs: Sequence[TrajectorySpec]) -> dict:
    """The workload's own figures, to print beside results."""
    responses = sorted(spec.response_tokens for spec in specs)
    calls = [spec.tool_calls for spec in specs]
    return {
        "trajectories": len(specs),
        "response_tokens_mean": statistics.fmean(responses),
        "response_tokens_p50": percentile(responses, 50),
        "response_tokens_p95": percentile(responses, 95),
        "generated_tokens_total": sum(spec.generated_tokens for spec in specs),
        "tool_calls_total": sum(calls),
        "tool_calls_mean": statistics.fmean(calls),
        "single_turn_fraction": sum(1 for c in calls if c == 0) / len(calls),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of `values` (any order)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(latencies_s: Sequence[float], generated_tokens: int, wall_s: float) -> dict:
    """One policy's run: trajectory latency percentiles and generated tokens per second over the run's wall time."""
    return {
        "trajectories": len(latencies_s),
        "latency_p50_s": percentile(latencies_s, 50),
        "latency_p95_s": percentile(latencies_s, 95),
        "generated_tokens": generated_tokens,
        "wall_s": wall_s,
        "throughput_tok_s": generated_tokens / wall_s,
    }


def goals(summaries: dict[str, dict]) -> list[dict]:
    """The routing goal: KV-aware p95 latency <= 0.8x least-requests' at equal throughput (reported beside it)."""
    kv, lr = summaries["kv_aware"], summaries["least_requests"]
    return [
        goal("p95 trajectory latency kv_aware / least_requests", round(kv["latency_p95_s"] / lr["latency_p95_s"], 4), "<=", 0.8, "ratio"),
        goal("throughput kv_aware / least_requests (equal throughput)", round(kv["throughput_tok_s"] / lr["throughput_tok_s"], 4), ">=", 0.95, "ratio"),
    ]
