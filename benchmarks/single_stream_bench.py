"""Where one user's stream spends its time: the engine's dtype and OpenMP threads at concurrency 1 (one
person chatting) and 32 (a loaded server), on the embedded default model.

Each configuration is one engine started with rstar's own code path (VllmEngine.start, compiled, the
configuration's settings) in a fresh process, since the OpenMP binding is fixed when an engine starts. Per
configuration, in that process:
  c1     8 prompts one after another, 64 tokens each (greedy, EOS ignored): tokens/s, the time per output token
         (first to last token over tokens after the first) p50/p95, and the CPU time per generated token of the
         engine core process and of this front-end process, each counted on its own.
  c32    32 prompts at once, 64 tokens each: tokens/s.
The prompts are the chat template's rendering of two kinds of request: server_bench's short prose prompts, and
a word problem with the tool prompt on, where the model writes Python.
The first configuration runs again at the end, so drift over the run shows beside the differences.

    python benchmarks/single_stream_bench.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from goals import percentiles_ms, run_header, write_report

REPO = Path(__file__).resolve().parent.parent
TOKENS = 64
PROSE = [f"Write two sentences about the number {i}." for i in range(40)]
WORD_PROBLEMS = [
    f"A shop sells pencils at {p} cents each. Maya buys {n} pencils and pays with a {b}-dollar bill. How many cents of change does she get?"
    for p, n, b in [(15, 7, 5), (23, 4, 2), (12, 9, 10), (35, 3, 5), (8, 11, 1), (19, 6, 20), (42, 2, 1), (17, 5, 10)] * 5
]
# Each configuration: a name and the engine settings it overrides; the first is what `auto` picked on CPUs
# without native bf16 before this benchmark (fp32, compiled, both cores bound).
CONFIGS = {
    "fp32_2threads": {"dtype": "float32", "cpu_threads_bind": "0-1"},
    "fp32_1thread": {"dtype": "float32", "cpu_threads_bind": "0"},
    "bf16_2threads": {"dtype": "bfloat16", "cpu_threads_bind": "0-1"},
    "bf16_1thread": {"dtype": "bfloat16", "cpu_threads_bind": "0"},
    "fp32_2threads_eager": {"dtype": "float32", "cpu_threads_bind": "0-1", "enforce_eager": True},
}


def process_tree_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of this process and of each of its descendants, by pid."""
    import psutil

    root = psutil.Process(pid)
    times = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            cpu = process.cpu_times()
            times[f"{process.pid}:{process.name()}"] = cpu.user + cpu.system
        except psutil.NoSuchProcess:
            pass
    return times


async def measure(overrides: dict, quick: bool) -> dict:
    from rstar.config import EngineSettings, load_settings
    from rstar.server.engine import SamplingOptions, VllmEngine
    from rstar.server.engine_defaults import describe
    from rstar.server.model_store import resolve_model
    from rstar.server.builtin_tools import builtin_tool_schemas
    from rstar.server.chat_template import choose_template

    settings = load_settings()
    model_dir = resolve_model("default", settings.models_dir).path
    engine_settings = EngineSettings(max_model_len=2048, **overrides)
    started = time.perf_counter()
    engine = await VllmEngine.start(model_dir, engine_settings, cache_dir=settings.cache_dir)
    start_s = time.perf_counter() - started
    template = choose_template(engine.tokenizer, "rstar")
    prompts = {
        "prose": [template.encode([{"role": "user", "content": p}]) for p in PROSE],
        "word_problem": [template.encode([{"role": "user", "content": p}], builtin_tool_schemas()) for p in WORD_PROBLEMS],
    }
    options = SamplingOptions(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)

    async def one(prompt_ids: list[int]) -> list[float]:
        arrivals = []
        async for delta in engine.generate(prompt_ids, options):
            arrivals += [time.perf_counter()] * len(delta.token_ids)
        assert len(arrivals) == TOKENS, len(arrivals)
        return arrivals

    result = {"start_s": round(start_s, 1), "defaults": describe(engine.defaults)}
    await one(prompts["prose"][0])  # the first request after start pays one-off costs
    c1_count = 3 if quick else 8
    for kind, kind_prompts in prompts.items():
        cpu_before, wall_before = process_tree_cpu_s(os.getpid()), time.perf_counter()
        per_token = []
        for prompt_ids in kind_prompts[:c1_count]:
            arrivals = await one(prompt_ids)
            per_token.append((arrivals[-1] - arrivals[0]) / (TOKENS - 1))
        wall = time.perf_counter() - wall_before
        cpu_after = process_tree_cpu_s(os.getpid())
        spent = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
        own = sum(spent.pop(name) for name in [n for n in spent if n.startswith(f"{os.getpid()}:")])
        generated = c1_count * TOKENS
        tpot = percentiles_ms(per_token, digits=2)
        result[f"c1_{kind}"] = {
            "tokens_per_s": round(generated / wall, 2),
            "tpot_p50_ms": tpot[0],
            "tpot_p95_ms": tpot[1],
            "front_end_cpu_ms_per_token": round(1000 * own / generated, 2),
            "engine_cpu_ms_per_token": round(1000 * sum(spent.values()) / generated, 2),
        }
    for kind, kind_prompts in prompts.items():
        wall_before = time.perf_counter()
        batches = await asyncio.gather(*(one(kind_prompts[i % len(kind_prompts)]) for i in range(32)))
        result[f"c32_{kind}"] = {"tokens_per_s": round(sum(len(b) for b in batches) / (time.perf_counter() - wall_before), 2)}
    await engine.shutdown()
    return result


def run_worker(name: str, overrides: dict, quick: bool) -> dict:
    """One configuration in a fresh process; its figures come back on the last line of its output."""
    command = [sys.executable, __file__, "--worker", json.dumps(overrides)] + (["--quick"] if quick else [])
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if completed.returncode != 0:
        print(completed.stderr[-3000:], file=sys.stderr)
        return {"error": completed.stderr.strip().splitlines()[-1] if completed.stderr.strip() else f"exit {completed.returncode}"}
    figures = json.loads(completed.stdout.strip().splitlines()[-1])
    print(f"{name}: {json.dumps(figures)}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 prompts per concurrency-1 kind")
    parser.add_argument("--only", nargs="*", help="configuration names to run (default: all)")
    parser.add_argument("--eager", action="store_true", help="every configuration eager: no compile per new dtype (minutes each)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "single_stream_bench.json"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(measure(json.loads(args.worker), args.quick))), flush=True)
        return
    began, load_before = time.perf_counter(), os.getloadavg()
    names = [name for name in CONFIGS if not args.only or name in args.only]
    configs = {name: CONFIGS[name] | ({"enforce_eager": True} if args.eager else {}) for name in names}
    results = {name: run_worker(name, overrides, args.quick) for name, overrides in configs.items()}
    results[f"{names[0]}_again"] = run_worker(f"{names[0]}_again", configs[names[0]], args.quick)
    # No goals of its own: it explains server_bench's concurrency-1 figures.
    report = run_header("single_stream_bench", began, load_before, args.quick) | {"tokens_per_request": TOKENS, "all_eager": args.eager, "configs": results, "goals": []}
    write_report(Path(args.out), report)


if __name__ == "__main__":
    main()
