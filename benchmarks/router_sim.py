"""A discrete-event simulator of N engine replicas behind the real router (`rstar.server.routing.Router`).

Why simulate: the question is what the routing policy does to an RL step at the paper's scale (512 prompts x 32
rollouts on 8 to 64 GPUs), which a 2-core development machine cannot run. The policies are not modelled here: every
routing decision is `Router.choose` on the replicas' state, followed by `Router.remember`, as server/replicas.py
does.

Engine model (vLLM V1's scheduler, simplified):
- continuous batching: every step each running sequence gains one token; a step takes
  `base + per_seq * running + per_context_token * (sum of the running sequences' contexts)`, plus
  `prefill_per_token` for each uncached prompt token of the sequences admitted at that step;
- a KV cache of `kv_capacity_tokens` in blocks of 16 tokens. A full block is keyed by an id that stands for
  its whole prefix, as vLLM's chained block hashes do (`routing.block_hashes`): the system prompt's blocks are
  everyone's, the problem's its group's, the rest one trajectory's own. Blocks of running sequences are held
  (shared blocks counted once), blocks of finished ones stay cached until evicted, least recently freed first;
- admission in arrival order while the head request's uncached blocks fit (and under `max_num_seqs`); when the
  running sequences' growth no longer fits, the most recently admitted one is preempted and recomputed later
  (vLLM's recompute preemption): its blocks are freed into the cache and it waits at the front of the queue;
- between turns a trajectory holds no KV blocks: vLLM frees a finished request's blocks, which stay only as
  evictable prefix cache while the tool runs, so the next turn re-uses them only if nothing evicted them and it
  lands on the same replica.
The router sees each replica's state as of its last step boundary (in flight, free KV blocks minus what waits in
the engine's queue), as a poller of `stats()` would.

Sequences are given to the router as block ids (one id per 16 tokens, `Router(block_tokens=1)`), and free KV in
blocks: the router's decisions depend on block-level prefixes only, and this keeps the simulator fast.

Runs: the paper's step (512 prompts x 32 rollouts, router_workload.py) at 8, 16, 32 and 64 replicas under each
policy, with an assumed 14B-on-MI300X cost model at two memory budgets (`gpu_cost_model`); and, when
`engine_costs.py` has measured this machine, two replicas of the default model with the CPU cost model on a
small workload (the live router_bench.py's counterpart). Output: JSON and a PNG of idle fraction and step time
against replicas per policy.

    python benchmarks/router_sim.py [--quick] [--jobs N] [--cpu-costs FILE] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import heapq
import itertools
import json
import math
import random
import sys
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from goals import write_report  # noqa: E402
from router_workload import LIVE_SHAPE, TrajectorySpec, WorkloadShape, describe, make_workload, summarize  # noqa: E402

from rstar.hardware import cpu_info  # noqa: E402
from rstar.server.routing import POLICIES, Policy, ReplicaState, Router  # noqa: E402

BLOCK_TOKENS = 16  # vLLM's default KV block size


@dataclass(frozen=True)
class CostModel:
    """What one replica costs: engine step times, KV room, and the tool-call latency its trajectories see."""

    name: str
    decode_step_base_s: float
    decode_step_per_seq_s: float
    decode_step_per_context_token_s: float
    prefill_per_token_s: float
    kv_capacity_tokens: int
    max_num_seqs: int  # the engine's, and the router's max_in_flight
    tool_latency_mean_s: float
    tool_latency_sigma: float  # log-normal shape of the tool latency (assumption in both models)
    basis: dict = field(default_factory=dict)  # where every figure comes from

    def chunk_s(self, steps: int, running: int, context_tokens: int) -> float:
        """Time of `steps` decode steps of `running` sequences whose contexts sum to `context_tokens` at the
        first step and grow by `running` tokens a step."""
        per_step = self.decode_step_base_s + self.decode_step_per_seq_s * running + self.decode_step_per_context_token_s * context_tokens
        return steps * per_step + self.decode_step_per_context_token_s * running * steps * (steps - 1) / 2

    def steps_under_way(self, elapsed_s: float, running: int, context_tokens: int) -> int:
        """How many steps have ended or are under way `elapsed_s` into a chunk (at least 1)."""
        low, high = 1, 1
        while self.chunk_s(high, running, context_tokens) < elapsed_s:
            low, high = high, high * 2
        while low < high:  # the first step count whose end is at or after elapsed_s
            middle = (low + high) // 2
            if self.chunk_s(middle, running, context_tokens) >= elapsed_s:
                high = middle
            else:
                low = middle + 1
        return low


def gpu_cost_model(memory_fraction: float = 0.85) -> CostModel:
    """ASSUMPTION, not measured: a 14B dense model (Qwen3-14B's shape: 40 layers, 8 KV heads of 128) in bf16 on
    one MI300X (the paper's GPU), tensor parallel 1. Decode is bandwidth-bound: every step reads the weights
    once and each running sequence's KV; prefill is compute-bound. Efficiencies are guesses stated as such.

    `memory_fraction` is the share of the GPU's memory the engine gets: 0.85 serving alone; in RL the trainer is
    colocated on the same GPUs (the paper's and verl's hybrid engine) and leaves the engine less, which is where
    the paper saw KV-cache overflow."""
    weights_bytes = 14.8e9 * 2
    kv_bytes_per_token = 2 * 40 * 8 * 128 * 2
    bandwidth = 5.3e12 * 0.5  # peak HBM3 bandwidth x an assumed 50% achieved
    prefill_flops = 1307e12 * 0.4  # peak dense bf16 x an assumed 40% achieved
    kv_bytes = 192e9 * memory_fraction - weights_bytes - 10e9  # ~10 GB activations and graphs
    return CostModel(
        name=f"gpu_assumed_14b_mi300x_mem{memory_fraction:.2f}",
        decode_step_base_s=weights_bytes / bandwidth + 2e-3,  # + ~2 ms scheduler/sampling overhead per step
        decode_step_per_seq_s=30e-6,  # assumed per-sequence sampling/bookkeeping cost
        decode_step_per_context_token_s=kv_bytes_per_token / bandwidth,
        prefill_per_token_s=2 * 14.8e9 / prefill_flops,
        kv_capacity_tokens=int(kv_bytes // kv_bytes_per_token),
        max_num_seqs=256,
        tool_latency_mean_s=0.3,  # the paper's mean per call, scheduling included (reference/rstar.md §2)
        tool_latency_sigma=0.5,
        basis={
            "kind": "assumption (no GPU measured)",
            "model": "14.8e9 parameters bf16, 40 layers x 8 KV heads x 128 (Qwen3-14B's shape): 163,840 KV bytes/token",
            "gpu": "MI300X: 192 GB HBM3, 5.3 TB/s peak (50% assumed achieved), 1307 TFLOP/s dense bf16 (40% assumed)",
            "kv_cache": f"192 GB x {memory_fraction} of memory for the engine - 29.6 GB weights - 10 GB activations",
            "decode_step": "weights read once per step + 2 ms fixed + 30 us per sequence + each running sequence's KV read",
            "prefill": "2 x parameters FLOPs per token",
            "max_num_seqs": "256 (vLLM's OpenAI-server default on large GPUs)",
            "tool_latency": "log-normal, mean 0.3 s (paper), sigma 0.5 (assumption)",
        },
    )


def cpu_cost_model(engine_costs: dict, tool_latency_s: float) -> CostModel:
    """Measured on this machine: `engine_costs.py`'s fit of the default model's engine, and the sandbox's per-call
    latency (benchmarks/README.md, sandbox_bench numpy-cell p50)."""
    fit = engine_costs["fit"]
    return CostModel(
        name="cpu_measured_default_model",
        decode_step_base_s=fit["decode_step_base_s"],
        decode_step_per_seq_s=fit["decode_step_per_seq_s"],
        decode_step_per_context_token_s=fit["decode_step_per_context_token_s"],
        prefill_per_token_s=fit["prefill_per_token_s"],
        kv_capacity_tokens=engine_costs["kv_cache"]["tokens"],
        max_num_seqs=engine_costs["engine_settings"]["max_num_seqs"],
        tool_latency_mean_s=tool_latency_s,
        tool_latency_sigma=0.5,
        basis={
            "kind": "measured here",
            "engine": f"engine_costs.py {engine_costs['date']} on {engine_costs['cpu']['model']}, model {engine_costs['model']}",
            "tool_latency": f"sandbox numpy-cell p50 {tool_latency_s * 1000:.2f} ms (benchmarks/README.md), log-normal sigma 0.5 (assumption)",
        },
    )


@dataclass(eq=False)
class Trajectory:
    spec: TrajectorySpec
    system_tokens: int
    turn: int = 0
    context_tokens: int = 0  # prompt + everything so far
    generated: int = 0
    finished_s: float | None = None
    _ids: list[int] = field(default_factory=list, repr=False)

    def block_ids(self, tokens: int) -> list[int]:
        """One id per full block of the first `tokens` tokens, standing for the block and every block before it:
        the system prompt's blocks are everyone's, the problem's its group's, the rest this trajectory's own."""
        shared_end, group_end = self.system_tokens, self.system_tokens + self.spec.problem_tokens
        for block in range(len(self._ids), tokens // BLOCK_TOKENS):
            end = (block + 1) * BLOCK_TOKENS
            if end <= shared_end:
                self._ids.append(block)
            elif end <= group_end:
                self._ids.append((self.spec.group + 1) * 10**6 + block)
            else:
                self._ids.append((self.spec.uid + 1) * 10**12 + block)
        return self._ids[: tokens // BLOCK_TOKENS]


@dataclass(eq=False)
class Request:
    """One turn of one trajectory, on one engine."""

    trajectory: Trajectory
    prompt_tokens: int
    remaining: int  # tokens still to sample in this turn
    blocks: list[int] = field(default_factory=list)  # ids of the prompt's full blocks
    start_step: int = 0
    epoch: int = 0  # bumped on preemption, so stale finish entries are skipped
    reserved_blocks: int = 0  # what it added to its replica's waiting_blocks: its blocks the replica lacks, + its tail
    due: int = 0  # tokens it may still write as the router sees it: its max_tokens, the trajectory's budget left

    @property
    def tail_tokens(self) -> int:
        return self.prompt_tokens - len(self.blocks) * BLOCK_TOKENS


class Replica:
    """One engine: its KV blocks, its queue and running batch, and its step clock."""

    def __init__(self, cost: CostModel, on_finish):
        self.cost = cost
        self.on_finish = on_finish  # called with (request, time) when a turn ends
        self.capacity_blocks = cost.kv_capacity_tokens // BLOCK_TOKENS
        self.held: dict[int, int] = {}  # block id -> running sequences using it
        self.cached: OrderedDict[int, None] = OrderedDict()  # freed blocks still holding their tokens, oldest first
        self.waiting: deque[Request] = deque()
        self.waiting_blocks = 0  # what the waiting requests will need at least (a block several share counts once)
        self.pending: Counter[int] = Counter()  # block id -> waiting requests whose prompt has it
        self.due_waiting = 0  # sum of `due` over waiting requests
        self.due_running_base = 0  # sum of (due + start_step) over running: what they may still write = this - n*steps
        self.running: list[Request] = []  # in admission order
        self.steps = 0
        self.private_base = 0  # sum of (tokens outside held blocks - start_step) over running: tokens at step s = this + n*s
        self.context_base = 0  # the same for whole contexts
        self.finishing: list[tuple[int, int, int, Request]] = []  # (step it ends at, tie-break, epoch, request)
        self.chunk: tuple[float, float, int, int, int] | None = None  # start, prefill s, steps, running, context
        self.version = 0  # bumped when the planned chunk end changes
        self.busy_s = self.batch_s = 0.0
        self.preemptions = self.prefill_tokens = self.cached_tokens = 0
        self._tie = itertools.count()

    @property
    def in_flight(self) -> int:
        return len(self.waiting) + len(self.running)

    def used_blocks(self) -> int:
        running = len(self.running)
        private = self.private_base + running * self.steps
        return len(self.held) + (private + running * (BLOCK_TOKENS - 1)) // BLOCK_TOKENS  # each partial block whole

    def free_blocks_for_router(self) -> int:
        """Free KV as stats would report it, minus what already waits here for room and what the requests here
        may still write (their max_tokens), as server/replicas.py counts it."""
        due = self.due_waiting + self.due_running_base - len(self.running) * self.steps
        return self.capacity_blocks - self.used_blocks() - self.waiting_blocks - due // BLOCK_TOKENS

    def submit(self, request: Request, now: float) -> float | None:
        """Queue a turn; returns when the replica's next step boundary is, if that moved earlier."""
        request.blocks = request.trajectory.block_ids(request.prompt_tokens)
        self._enqueue(request, first=False)
        if self.chunk is None:
            return self.plan(now)
        start, prefill_s, steps, running, context = self.chunk
        under_way = self.cost.steps_under_way(now - start - prefill_s, running, context)
        if under_way >= steps:
            return None
        self.chunk = (start, prefill_s, under_way, running, context)
        self.version += 1
        return start + prefill_s + self.cost.chunk_s(under_way, running, context)

    def end_chunk(self, now: float) -> float | None:
        start, prefill_s, steps, running, _ = self.chunk
        self.busy_s += now - start
        self.batch_s += running * (now - start)
        self.steps += steps
        self.chunk = None
        while self.finishing and self.finishing[0][0] <= self.steps:
            _, _, epoch, request = heapq.heappop(self.finishing)
            if epoch != request.epoch:
                continue
            self._leave(request)
            self.on_finish(request, now)
        return self.plan(now)

    def plan(self, now: float) -> float | None:
        """Admit what fits, preempt what no longer fits, and start the next chunk of steps; returns its end."""
        prefill_s = self._admit()
        while self.running:
            running = len(self.running)
            room = (self.capacity_blocks - len(self.held)) * BLOCK_TOKENS - self.private_base - running * (BLOCK_TOKENS - 1)
            fits_steps = room // running - self.steps
            if fits_steps >= 1:
                break
            self._preempt(self.running[-1])
        if not self.running:
            if self.waiting:
                raise RuntimeError("a request that fits no empty engine: KV cache smaller than one sequence")
            return None
        to_finish = self.finishing[0][0] - self.steps
        steps = max(1, min(to_finish, fits_steps))
        running, context = len(self.running), self.context_base + len(self.running) * self.steps
        self.chunk = (now, prefill_s, steps, running, context)
        self.version += 1
        return now + prefill_s + self.cost.chunk_s(steps, running, context)

    def _admit(self) -> float:
        prefill_tokens = 0
        while self.waiting and len(self.running) < self.cost.max_num_seqs:
            request = self.waiting[0]
            cached, prefix, new_blocks = 0, True, 1  # + the partial tail
            for block in request.blocks:
                prefix = prefix and (block in self.held or block in self.cached)
                cached += prefix
                new_blocks += block not in self.held
            next_step = -(-(len(self.running) + 1) // BLOCK_TOKENS)  # room for everyone's next token, or it thrashes
            if self.used_blocks() + new_blocks + next_step > self.capacity_blocks:
                break
            self.waiting.popleft()
            self.waiting_blocks -= request.reserved_blocks
            self.pending.subtract(request.blocks)
            self.due_waiting -= request.due
            self.due_running_base += request.due + self.steps
            for block in request.blocks:
                self.cached.pop(block, None)
                self.held[block] = self.held.get(block, 0) + 1
            self._evict()
            uncached = request.prompt_tokens - cached * BLOCK_TOKENS
            prefill_tokens += uncached
            self.prefill_tokens += uncached
            self.cached_tokens += cached * BLOCK_TOKENS
            request.start_step = self.steps
            self.running.append(request)
            self.private_base += request.tail_tokens - self.steps
            self.context_base += request.prompt_tokens - self.steps
            heapq.heappush(self.finishing, (self.steps + request.remaining, next(self._tie), request.epoch, request))
        return prefill_tokens * self.cost.prefill_per_token_s

    def _preempt(self, request: Request) -> None:
        """vLLM's recompute preemption: free its blocks (they stay cached), and queue it first, progress kept."""
        self.preemptions += 1
        progress = self.steps - request.start_step
        self._leave(request)
        request.epoch += 1
        request.prompt_tokens += progress
        request.remaining -= progress
        request.due -= progress
        request.trajectory.generated += progress
        request.blocks = request.trajectory.block_ids(request.prompt_tokens)
        self._enqueue(request, first=True)

    def _enqueue(self, request: Request, first: bool) -> None:
        if first:
            self.waiting.appendleft(request)
        else:
            self.waiting.append(request)
        request.reserved_blocks = 1 + sum(
            block not in self.held and block not in self.cached and self.pending[block] <= 0 for block in request.blocks
        )
        self.pending.update(request.blocks)
        self.waiting_blocks += request.reserved_blocks
        self.due_waiting += request.due

    def _leave(self, request: Request) -> None:
        """Take a running request out: its held blocks and the full blocks it wrote become evictable cache."""
        progress = self.steps - request.start_step
        self.running.remove(request)
        self.due_running_base -= request.due + request.start_step
        self.private_base -= request.tail_tokens - request.start_step
        self.context_base -= request.prompt_tokens - request.start_step
        written = request.trajectory.block_ids(request.prompt_tokens + progress)
        freed = []
        for block in request.blocks:
            self.held[block] -= 1
            if not self.held[block]:
                del self.held[block]
                freed.append(block)
        freed += [block for block in written[len(request.blocks) :] if block not in self.held]
        for block in reversed(freed):  # a sequence's last blocks are evicted before its first
            self.cached[block] = None
            self.cached.move_to_end(block)
        self._evict()

    def _evict(self) -> None:
        while self.cached and self.used_blocks() + len(self.cached) > self.capacity_blocks:
            self.cached.popitem(last=False)


@dataclass
class SimResult:
    policy: str
    replicas: int
    makespan_s: float
    latencies_s: list[float]
    generated_tokens: int
    requested_tokens: int
    preemptions: int
    prefill_tokens: int
    cached_prompt_tokens: int
    idle_fraction: float
    mean_running_per_replica: float
    router_wait_mean_s: float
    wall_s: float

    def report(self) -> dict:
        figures = summarize(self.latencies_s, self.generated_tokens, self.makespan_s)
        extra = asdict(self)
        del extra["latencies_s"]
        return figures | extra | {"prefix_cache_hit": self.cached_prompt_tokens / max(1, self.cached_prompt_tokens + self.prefill_tokens)}


def simulate(specs: Sequence[TrajectorySpec], replicas: int, policy: Policy, cost: CostModel, system_tokens: int, seed: int = 0,
             max_response_tokens: int = WorkloadShape().max_response_tokens) -> SimResult:
    """One RL step: every trajectory starts at time 0; returns when the last one has finished. Each turn asks
    for what is left of `max_response_tokens` (the rollout budget, as the agent loop does), not its drawn length,
    which no router knows in advance."""
    started = time.perf_counter()
    rng = random.Random(seed)
    tool_mu = math.log(cost.tool_latency_mean_s) - cost.tool_latency_sigma**2 / 2
    router = Router(replicas=replicas, policy=policy, max_in_flight=cost.max_num_seqs, block_tokens=1, max_blocks=1 << 20)
    events: list[tuple[float, int, str, object, int]] = []  # time, tie-break, kind, subject, version
    tie = itertools.count()
    queue: deque[tuple[Trajectory, float]] = deque()  # turns waiting at the router, with when they got there
    waited: list[float] = []

    def schedule_chunk(replica_index: int, end: float | None) -> None:
        if end is not None:
            heapq.heappush(events, (end, next(tie), "chunk", replica_index, engines[replica_index].version))

    def turn_done(replica_index: int, request: Request, now: float) -> None:
        trajectory = request.trajectory
        trajectory.generated += request.remaining  # what was left at its last (re)admission, all sampled now
        turn = trajectory.spec.turns[trajectory.turn]
        trajectory.context_tokens += turn.generated
        router.remember(replica_index, trajectory.block_ids(trajectory.context_tokens))  # as replicas.py does at a finish
        if trajectory.turn + 1 == len(trajectory.spec.turns):
            trajectory.finished_s = now
            return
        latency = rng.lognormvariate(tool_mu, cost.tool_latency_sigma)
        heapq.heappush(events, (now + latency, next(tie), "tool", trajectory, 0))

    engines = [Replica(cost, functools.partial(turn_done, index)) for index in range(replicas)]

    def dispatch(now: float) -> None:
        # The router answers None while every replica is at max_in_flight (or, KV-aware, has no room for the turn's
        # budget); ask it only when one might have room.
        while queue and any(engine.in_flight < cost.max_num_seqs for engine in engines):
            trajectory, since = queue[0]
            ids = trajectory.block_ids(trajectory.context_tokens)
            turn = trajectory.spec.turns[trajectory.turn]
            due = max(turn.generated, max_response_tokens - (trajectory.context_tokens - system_tokens - trajectory.spec.problem_tokens))
            states = [ReplicaState(True, engine.in_flight, engine.free_blocks_for_router()) for engine in engines]
            choice = router.choose(ids, states, max_tokens=-(-due // BLOCK_TOKENS))  # the router counts in blocks here
            if choice is None:
                return  # the turn waits here, first in line
            queue.popleft()
            waited.append(now - since)
            router.remember(choice, ids)
            schedule_chunk(choice, engines[choice].submit(Request(trajectory, trajectory.context_tokens, turn.generated, due=due), now))

    trajectories = [Trajectory(spec, system_tokens, context_tokens=system_tokens + spec.problem_tokens) for spec in specs]
    queue.extend((trajectory, 0.0) for trajectory in trajectories)
    dispatch(0.0)
    now = 0.0
    while events:
        now, _, kind, subject, version = heapq.heappop(events)
        if kind == "chunk":
            engine = engines[subject]
            if version != engine.version:
                continue
            schedule_chunk(subject, engine.end_chunk(now))
        else:
            subject.context_tokens += subject.spec.turns[subject.turn].tool_response
            subject.turn += 1
            queue.append((subject, now))
        dispatch(now)

    unfinished = [t.spec.uid for t in trajectories if t.finished_s is None]
    if unfinished or queue:
        raise RuntimeError(f"simulation ended with {len(unfinished)} unfinished trajectories")
    makespan = max(t.finished_s for t in trajectories)
    return SimResult(
        policy=policy,
        replicas=replicas,
        makespan_s=makespan,
        latencies_s=[t.finished_s for t in trajectories],
        generated_tokens=sum(t.generated for t in trajectories),
        requested_tokens=sum(spec.generated_tokens for spec in specs),
        preemptions=sum(e.preemptions for e in engines),
        prefill_tokens=sum(e.prefill_tokens for e in engines),
        cached_prompt_tokens=sum(e.cached_tokens for e in engines),
        idle_fraction=1 - sum(e.busy_s for e in engines) / (replicas * makespan),
        mean_running_per_replica=sum(e.batch_s for e in engines) / (replicas * makespan),
        router_wait_mean_s=sum(waited) / len(waited),
        wall_s=time.perf_counter() - started,
    )


GPU_MEMORY_FRACTIONS = (0.85, 0.45)  # the engine alone on its GPUs; beside a colocated trainer (assumption)
SANDBOX_NUMPY_CELL_P50_S = 4.25e-3  # benchmarks/README.md, sandbox_bench quick run 2026-12-01 15:26 (ours)


def run_grid(specs: Sequence[TrajectorySpec], replica_counts: Sequence[int], cost: CostModel, system_tokens: int, jobs: int = 1) -> list[dict]:
    """Every policy at every replica count; `jobs` processes share the runs (each is independent)."""
    cells = [(replicas, policy) for replicas in replica_counts for policy in POLICIES]
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        runs = [pool.submit(simulate, specs, replicas, policy, cost, system_tokens) for replicas, policy in cells]
        rows = []
        for run in runs:
            row = run.result().report()
            print(
                f"{cost.name} {row['replicas']:>3} replicas {row['policy']:<14} step {row['makespan_s']:8.1f} s  p50 {row['latency_p50_s']:7.1f} s  "
                f"p95 {row['latency_p95_s']:7.1f} s  {row['throughput_tok_s']:9.0f} tok/s  idle {row['idle_fraction']:.3f}  "
                f"preempt {row['preemptions']:6d}  cache hit {row['prefix_cache_hit']:.3f}  ({row['wall_s']:.1f} s)",
                flush=True,
            )
            rows.append(row)
    return rows


def plot(sections: Sequence[dict], path: Path, title: str) -> None:
    """Idle fraction and step time against replicas, one line per policy, one row per cost model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, grid = plt.subplots(len(sections), 2, figsize=(11, 4 * len(sections)), squeeze=False)
    for (idle_axes, step_axes), section in zip(grid, sections):
        rows = section["results"]
        counts = sorted({row["replicas"] for row in rows})
        for policy in POLICIES:
            mine = sorted((row for row in rows if row["policy"] == policy), key=lambda row: row["replicas"])
            idle_axes.plot([row["replicas"] for row in mine], [row["idle_fraction"] for row in mine], marker="o", label=policy)
            step_axes.plot([row["replicas"] for row in mine], [row["makespan_s"] for row in mine], marker="o", label=policy)
        for axes, label in ((idle_axes, "idle fraction of engine time"), (step_axes, "step time (makespan), s")):
            axes.set_xscale("log", base=2)
            axes.set_xticks(counts, [str(count) for count in counts])
            axes.set_xlabel("replicas")
            axes.set_ylabel(label)
            axes.set_title(section["cost_model"]["name"], fontsize=9)
            axes.grid(alpha=0.3)
            axes.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 prompts instead of 512, 8 and 16 replicas")
    parser.add_argument("--cpu-costs", type=Path, default=Path("benchmarks/results/engine_costs.json"), help="engine_costs.py's output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="simulations run in parallel processes")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/router_sim.json"))
    args = parser.parse_args()

    shape = WorkloadShape(prompts=64) if args.quick else WorkloadShape()
    replica_counts = (8, 16) if args.quick else (8, 16, 32, 64)
    specs = make_workload(shape, args.seed)
    print(f"workload: {json.dumps(describe(specs))}", flush=True)
    gpu_sections = []
    for memory_fraction in GPU_MEMORY_FRACTIONS:
        gpu = gpu_cost_model(memory_fraction)
        rows = run_grid(specs, replica_counts, gpu, shape.system_tokens, args.jobs)
        gpu_sections.append({"cost_model": asdict(gpu), "results": rows})

    cpu_section = None
    if args.cpu_costs.exists():
        cpu = cpu_cost_model(json.loads(args.cpu_costs.read_text()), SANDBOX_NUMPY_CELL_P50_S)
        cpu_specs = make_workload(LIVE_SHAPE, seed=0)  # router_bench.py's step
        cpu_section = {"cost_model": asdict(cpu), "workload": LIVE_SHAPE.to_dict(), "workload_figures": describe(cpu_specs), "results": run_grid(cpu_specs, (2,), cpu, LIVE_SHAPE.system_tokens, args.jobs)}
    else:
        print(f"no {args.cpu_costs}: run benchmarks/engine_costs.py for the CPU cost model; simulating the GPU models only")

    result = {
        "benchmark": "router_sim",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_info().to_dict(),
        "quick": args.quick,
        "seed": args.seed,
        "workload": shape.to_dict(),
        "workload_figures": describe(specs),
        "gpu": gpu_sections,
        "cpu_two_replicas": cpu_section,
        "goals": [],  # the simulator predicts; the routing goal is measured live by router_bench.py
    }
    write_report(args.out, result)
    plot_path = args.out.with_suffix(".png")
    plot(gpu_sections, plot_path, f"simulated RL step, {shape.prompts} prompts x {shape.rollouts} rollouts, assumed 14B-on-MI300X costs")
    print(f"wrote {plot_path}")


if __name__ == "__main__":
    main()
