"""Sandbox latency and throughput: our warm zygote pool vs a fresh process per call.

Compared, in one run:
  ours          rstar.sandbox in-process client: bubblewrap zygote, pre-forked hardened cells (2 workers)
  python_c      a fresh `python -c CODE` per call (this venv's interpreter, site enabled so numpy imports):
                what code-judge does by default, with no isolation at all
  bwrap_python  a fresh `bwrap --unshare-all --ro-bind / / ... python -c CODE` per call: the isolation
                code-judge's README offers

For each: p50/p95/p99 latency of `print(1)` one call at a time, calls/s with 4 calls in flight, and the
latency of a numpy and a sympy cell (import included: that is the point of the warm zygote).

    python benchmarks/sandbox_bench.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

from rstar.sandbox.clients import LocalClient
from rstar.sandbox.settings import SandboxSettings

PRINT1 = "print(1)"
NUMPY_CELL = "import numpy as np\nprint(np.linalg.det(np.eye(50)))"
SYMPY_CELL = "import sympy as sp\nprint(sp.factorint(2**64 - 1))"
CONCURRENCY = 4


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000

    return {"n": len(ordered), "p50_ms": round(pick(0.50), 3), "p95_ms": round(pick(0.95), 3),
            "p99_ms": round(pick(0.99), 3), "mean_ms": round(statistics.fmean(ordered) * 1000, 3)}


class Ours:
    name = "ours"

    def __init__(self) -> None:
        self.client = LocalClient(SandboxSettings(workers=2))

    async def start(self) -> None:
        await self.client.start()

    async def call(self, code: str) -> None:
        result = await self.client.run({"code": code})
        if not result.ok:
            raise RuntimeError(f"ours failed: {result}")

    async def close(self) -> None:
        await self.client.close()


class FreshProcess:
    def __init__(self, name: str, prefix: list[str]) -> None:
        self.name, self.prefix = name, prefix

    async def start(self) -> None:
        pass

    async def call(self, code: str) -> None:
        proc = await asyncio.create_subprocess_exec(*self.prefix, sys.executable, "-c", code,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{self.name} failed: {err.decode()[-300:]}")

    async def close(self) -> None:
        pass


def bwrap_prefix() -> list[str] | None:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None
    return [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/",
            "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]


async def sequential(runner, code: str, n: int) -> dict:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await runner.call(code)
        samples.append(time.perf_counter() - started)
    return percentiles(samples)


async def throughput(runner, code: str, n: int) -> dict:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with gate:
            await runner.call(code)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - started
    return {"n": n, "in_flight": CONCURRENCY, "seconds": round(elapsed, 3), "calls_per_s": round(n / elapsed, 1)}


async def measure(runner, sizes: dict) -> dict:
    await runner.start()
    try:
        await sequential(runner, PRINT1, 5)  # warm caches / first fork
        return {
            "print1": await sequential(runner, PRINT1, sizes["latency"]),
            "throughput": await throughput(runner, PRINT1, sizes["throughput"]),
            "numpy_cell": await sequential(runner, NUMPY_CELL, sizes["heavy"]),
            "sympy_cell": await sequential(runner, SYMPY_CELL, max(3, sizes["heavy"] // 3)),
        }
    finally:
        await runner.close()


async def main_async(quick: bool) -> dict:
    ours_sizes = {"latency": 300, "throughput": 1000, "heavy": 60} if quick else {"latency": 2000, "throughput": 5000, "heavy": 300}
    fresh_sizes = {"latency": 40, "throughput": 80, "heavy": 9} if quick else {"latency": 200, "throughput": 400, "heavy": 45}
    runners = [(Ours(), ours_sizes), (FreshProcess("python_c", []), fresh_sizes)]
    prefix = bwrap_prefix()
    if prefix:
        runners.append((FreshProcess("bwrap_python", prefix), fresh_sizes))
    results = {}
    for runner, sizes in runners:
        print(f"measuring {runner.name} ...", flush=True)
        results[runner.name] = await measure(runner, sizes)
    return results


def report(results: dict, quick: bool) -> dict:
    ours = results["ours"]
    ratios = {}
    for base in ("python_c", "bwrap_python"):
        if base in results:
            b = results[base]
            ratios[base] = {
                "print1_p50_speedup": round(b["print1"]["p50_ms"] / ours["print1"]["p50_ms"], 1),
                "print1_p99_speedup": round(b["print1"]["p99_ms"] / ours["print1"]["p99_ms"], 1),
                "calls_per_s_ratio": round(ours["throughput"]["calls_per_s"] / b["throughput"]["calls_per_s"], 1),
                "numpy_cell_p50_speedup": round(b["numpy_cell"]["p50_ms"] / ours["numpy_cell"]["p50_ms"], 1),
                "sympy_cell_p50_speedup": round(b["sympy_cell"]["p50_ms"] / ours["sympy_cell"]["p50_ms"], 1),
            }
    # "A numpy/sympy cell pays no import cost": the import line adds next to nothing over print(1).
    numpy_extra = round(ours["numpy_cell"]["p50_ms"] - ours["print1"]["p50_ms"], 3)
    goals = [
        {"name": "print1_p50", "value": ours["print1"]["p50_ms"], "op": "<=", "target": 5, "unit": "ms"},
        {"name": "print1_p99", "value": ours["print1"]["p99_ms"], "op": "<=", "target": 25, "unit": "ms"},
        {"name": "calls_per_s_2_cores", "value": ours["throughput"]["calls_per_s"], "op": ">=", "target": 200, "unit": "calls/s"},
        {"name": "numpy_cell_extra_over_print1_p50", "value": numpy_extra, "op": "<=", "target": 5, "unit": "ms"},
        {"name": "sympy_import_paid", "value": ours["sympy_cell"]["p50_ms"], "op": "<=",
         "target": round(results["python_c"]["sympy_cell"]["p50_ms"] / 10, 1), "unit": "ms"},
    ]
    return {
        "benchmark": "sandbox_bench",
        "quick": quick,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "cells": {"print1": PRINT1, "numpy_cell": NUMPY_CELL, "sympy_cell": SYMPY_CELL},
        "results": results,
        "ratios": ratios,
        "goals": goals,
    }


def print_table(out: dict) -> None:
    header = f"{'':14} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'calls/s':>9} {'numpy p50':>10} {'sympy p50':>10}"
    print(header)
    for name, r in out["results"].items():
        print(f"{name:14} {r['print1']['p50_ms']:9.2f} {r['print1']['p95_ms']:9.2f} {r['print1']['p99_ms']:9.2f} "
              f"{r['throughput']['calls_per_s']:9.1f} {r['numpy_cell']['p50_ms']:10.2f} {r['sympy_cell']['p50_ms']:10.2f}")
    for base, ratio in out["ratios"].items():
        print(f"ours vs {base}: " + ", ".join(f"{k} {v}x" for k, v in ratio.items()))
    for goal in out["goals"]:
        met = goal["value"] <= goal["target"] if goal["op"] == "<=" else goal["value"] >= goal["target"]
        print(f"goal {goal['name']}: {goal['value']} {goal['op']} {goal['target']} {goal['unit']} -> {'met' if met else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workload (well under 3 minutes)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "sandbox_bench.json")
    args = parser.parse_args()
    results = asyncio.run(main_async(args.quick))
    out = report(results, args.quick)
    print_table(out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
