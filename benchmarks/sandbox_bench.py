"""Sandbox latency and throughput: our warm zygote pool vs an unisolated warm pool and a fresh process per call.

Compared, in one run:
  ours          rstar.sandbox in-process client: bubblewrap zygote, pre-forked hardened cells (2 workers)
  warm_fork     2 warm servers (this script with --warm-server: the zygote's preloads, gc frozen the same
                way) that fork a fresh process per call and run it through the same cell runner: ours without
                isolation. What isolation costs is the gap between ours and this (the goals).
  warm_pool     the same servers running each call in themselves: no isolation and no fresh process per
                call, the floor of any warm design (figures only)
  python_c      a fresh `python -c CODE` per call (this venv's interpreter, site enabled so numpy imports):
                what code-judge does by default, with no isolation at all
  bwrap_python  a fresh `bwrap --unshare-all --ro-bind / / ... python -c CODE` per call: the isolation
                code-judge's README offers

For each: p50/p95/p99 latency of `print(1)` one call at a time, calls/s with 4 calls in flight with the CPU
time and minor page faults each call cost the machine (every process of the runner), and the
latency of a numpy, a sympy and a figure cell (a matplotlib line plot saved as PNG; imports included: that is
the point of the warm zygote). The warm runners also time the figure left open instead, which they return as
a PNG (`figure_returned`: what a cell's figure costs beyond the plot itself). The goals are
ratios between runners measured in the same run, so they hold on any machine; the JSON records the CPU.

    python benchmarks/sandbox_bench.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import io
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

from goals import goal, write_report

from rstar.hardware import cpu_info
from rstar.orphan_guard import descendants, process_table
from rstar.sandbox import cell, figures, protocol
from rstar.sandbox.launch import THREAD_ENV
from rstar.sandbox.clients import LocalClient
from rstar.sandbox.settings import SandboxSettings

PRINT1 = "print(1)"
NUMPY_CELL = "import numpy as np\nprint(np.linalg.det(np.eye(50)))"
SYMPY_CELL = "import sympy as sp\nprint(sp.factorint(2**64 - 1))"
FIGURE_CELL = """import io
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot(range(100), [x * x for x in range(100)])
fig.savefig(io.BytesIO(), format="png")
plt.close(fig)"""
# The same plot left open: the sandbox returns it (sandbox/figures.py). A fresh python3 would return nothing.
FIGURE_RETURNED = """import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot(range(100), [x * x for x in range(100)])"""
CONCURRENCY = 4
WORKERS = 2  # ours and the warm baselines alike
_DEFAULTS = SandboxSettings()
FIGURE_LIMITS = figures.Limits(_DEFAULTS.max_images_per_cell, _DEFAULTS.max_image_pixels, _DEFAULTS.max_image_bytes)


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000

    return {"n": len(ordered), "p50_ms": round(pick(0.50), 3), "p95_ms": round(pick(0.95), 3),
            "p99_ms": round(pick(0.99), 3), "mean_ms": round(statistics.fmean(ordered) * 1000, 3)}


class Ours:
    name = "ours"
    returns_figures = True

    def __init__(self) -> None:
        self.client = LocalClient(SandboxSettings(workers=WORKERS))

    async def start(self) -> None:
        await self.client.start()

    async def call(self, code: str) -> None:
        result = await self.client.run({"code": code})
        if not result.ok or len(result.images) != (code == FIGURE_RETURNED):
            raise RuntimeError(f"ours failed: {result}")

    async def close(self) -> None:
        await self.client.close()


def _run_captured(code: str) -> dict:
    """One call in a warm server: the zygote's cell runner and figure capture, output captured, a fresh
    namespace each time."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        figures.begin(FIGURE_LIMITS, capture_show=True)
        status, _ = cell.run_cell(code, cell.new_namespace())
        images, _ = figures.collect()
    return {"status": status, "output": out.getvalue(), "images": len(images)}


def serve_warm(fork_per_call: bool) -> None:
    """A warm baseline's server (`--warm-server`): preload as the zygote does, then answer one frame per call
    on stdin/stdout, in a forked child or in itself. No isolation of any kind."""
    cell.preload(SandboxSettings().preload)
    gc.collect()
    gc.freeze()
    protocol.write_frame(1, {"ready": True})
    while (request := protocol.read_frame(0)) is not None:
        if not fork_per_call:
            protocol.write_frame(1, _run_captured(request["code"]))
            continue
        pid = os.fork()
        if pid == 0:
            protocol.write_frame(1, _run_captured(request["code"]))
            os._exit(0)
        os.waitpid(pid, 0)


class WarmServers:
    """WORKERS warm servers; a call takes whichever is free."""

    returns_figures = True

    def __init__(self, name: str, fork_per_call: bool) -> None:
        self.name, self.mode = name, "fork" if fork_per_call else "reuse"
        self.free: asyncio.Queue = asyncio.Queue()
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self) -> None:
        for _ in range(WORKERS):
            # One BLAS thread per call, as the zygote's cells get (THREAD_ENV must be set before numpy loads).
            proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--warm-server", self.mode,
                                                        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                        env={**os.environ, **THREAD_ENV})
            await protocol.read_frame_async(proc.stdout)  # ready: preloads done
            self.procs.append(proc)
            self.free.put_nowait(proc)

    async def call(self, code: str) -> None:
        proc = await self.free.get()
        try:
            proc.stdin.write(protocol.encode({"code": code}))
            await proc.stdin.drain()
            answer = await protocol.read_frame_async(proc.stdout)
        finally:
            self.free.put_nowait(proc)
        if answer["status"] != "ok" or answer["images"] != (code == FIGURE_RETURNED):
            raise RuntimeError(f"{self.name} failed: {answer['output'][-300:]}")

    async def close(self) -> None:
        for proc in self.procs:
            proc.stdin.close()
            await proc.wait()


class FreshProcess:
    returns_figures = False

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


def tree_usage() -> tuple[float, int]:
    """CPU seconds and minor page faults of this process and every process under it, counting the ones that
    exited once their parent reaped them (the zygote reaps its cells, a warm server its forks, this process
    the fresh interpreters). A delta over a run is what the run cost the machine, wherever it ran."""
    table = process_table()
    tree = [os.getpid(), *descendants(os.getpid(), table)]
    stats = {pid: table[pid] for pid in tree if pid in table}
    ticks = os.sysconf("SC_CLK_TCK")
    # fields[7:9]: minor faults, of reaped children; fields[11:15]: user and system time, of reaped children
    cpu = sum(int(value) for fields in stats.values() for value in fields[11:15]) / ticks
    faults = sum(int(fields[7]) + int(fields[8]) for fields in stats.values())
    return cpu, faults


async def throughput(runner, code: str, n: int) -> dict:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with gate:
            await runner.call(code)

    cpu_before, faults_before = tree_usage()
    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - started
    cpu_after, faults_after = tree_usage()
    return {"n": n, "in_flight": CONCURRENCY, "seconds": round(elapsed, 3), "calls_per_s": round(n / elapsed, 1),
            "cpu_ms_per_call": round((cpu_after - cpu_before) * 1000 / n, 2), "minor_faults_per_call": round((faults_after - faults_before) / n, 1)}


async def measure(runner, sizes: dict) -> dict:
    await runner.start()
    try:
        await sequential(runner, PRINT1, 5)  # warm caches / first fork
        return {
            "print1": await sequential(runner, PRINT1, sizes["latency"]),
            "throughput": await throughput(runner, PRINT1, sizes["throughput"]),
            "numpy_cell": await sequential(runner, NUMPY_CELL, sizes["heavy"]),
            "sympy_cell": await sequential(runner, SYMPY_CELL, max(3, sizes["heavy"] // 3)),
            "figure_cell": await sequential(runner, FIGURE_CELL, max(3, sizes["heavy"] // 3)),
            **({"figure_returned": await sequential(runner, FIGURE_RETURNED, max(3, sizes["heavy"] // 3))} if runner.returns_figures else {}),
        }
    finally:
        await runner.close()


async def main_async(quick: bool) -> dict:
    ours_sizes = {"latency": 300, "throughput": 1000, "heavy": 60} if quick else {"latency": 2000, "throughput": 5000, "heavy": 300}
    fresh_sizes = {"latency": 40, "throughput": 80, "heavy": 9} if quick else {"latency": 200, "throughput": 400, "heavy": 45}
    runners = [(Ours(), ours_sizes), (WarmServers("warm_fork", True), ours_sizes),
               (WarmServers("warm_pool", False), ours_sizes),
               (FreshProcess("python_c", []), fresh_sizes)]
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
    for base in ("warm_fork", "warm_pool", "python_c", "bwrap_python"):
        if base in results:
            b = results[base]
            ratios[base] = {
                "print1_p50_speedup": round(b["print1"]["p50_ms"] / ours["print1"]["p50_ms"], 2),
                "print1_p99_speedup": round(b["print1"]["p99_ms"] / ours["print1"]["p99_ms"], 2),
                "calls_per_s_ratio": round(ours["throughput"]["calls_per_s"] / b["throughput"]["calls_per_s"], 2),
                "numpy_cell_p50_speedup": round(b["numpy_cell"]["p50_ms"] / ours["numpy_cell"]["p50_ms"], 2),
                "sympy_cell_p50_speedup": round(b["sympy_cell"]["p50_ms"] / ours["sympy_cell"]["p50_ms"], 2),
                "figure_cell_p50_speedup": round(b["figure_cell"]["p50_ms"] / ours["figure_cell"]["p50_ms"], 2),
            }
    warm = results["warm_fork"]
    goals = [
        # Isolation nearly free: within 1.25x of the same warm fork per call with no isolation at all.
        goal("print1_p50_over_warm_fork", round(ours["print1"]["p50_ms"] / warm["print1"]["p50_ms"], 2), "<=", 1.25, "x"),
        goal("warm_fork_calls_per_s_over_ours", round(warm["throughput"]["calls_per_s"] / ours["throughput"]["calls_per_s"], 2), "<=", 1.25, "x"),
        # Warm pays: at least 3x a fresh interpreter per call.
        goal("print1_p50_speedup_over_python_c", ratios["python_c"]["print1_p50_speedup"], ">=", 3, "x"),
        goal("calls_per_s_over_python_c", ratios["python_c"]["calls_per_s_ratio"], ">=", 3, "x"),
        # A numpy/sympy cell pays no import cost: a tenth of what a fresh process pays, or less.
        goal("numpy_cell_p50_speedup_over_python_c", ratios["python_c"]["numpy_cell_p50_speedup"], ">=", 10, "x"),
        goal("sympy_cell_p50_speedup_over_python_c", ratios["python_c"]["sympy_cell_p50_speedup"], ">=", 10, "x"),
        # A figure cell finds matplotlib loaded and warm: it costs a fifth of a fresh interpreter's, or less.
        goal("figure_cell_p50_speedup_over_python_c", ratios["python_c"]["figure_cell_p50_speedup"], ">=", 5, "x"),
    ]
    return {
        "benchmark": "sandbox_bench",
        "quick": quick,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "cpu": cpu_info().to_dict(),
        "cells": {"print1": PRINT1, "numpy_cell": NUMPY_CELL, "sympy_cell": SYMPY_CELL, "figure_cell": FIGURE_CELL, "figure_returned": FIGURE_RETURNED},
        "results": results,
        "ratios": ratios,
        "goals": goals,
    }


def print_table(out: dict) -> None:
    header = (f"{'':14} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'calls/s':>9} {'CPU ms/call':>12} {'faults/call':>12} "
              f"{'numpy p50':>10} {'sympy p50':>10} {'figure p50':>11} {'returned':>9}")
    print(header)
    for name, r in out["results"].items():
        t = r["throughput"]
        print(f"{name:14} {r['print1']['p50_ms']:9.2f} {r['print1']['p95_ms']:9.2f} {r['print1']['p99_ms']:9.2f} "
              f"{t['calls_per_s']:9.1f} {t['cpu_ms_per_call']:12.2f} {t['minor_faults_per_call']:12.1f} "
              f"{r['numpy_cell']['p50_ms']:10.2f} {r['sympy_cell']['p50_ms']:10.2f} {r['figure_cell']['p50_ms']:11.2f} "
              + (f"{r['figure_returned']['p50_ms']:9.2f}" if "figure_returned" in r else f"{'-':>9}"))
    for base, ratio in out["ratios"].items():
        print(f"ours vs {base}: " + ", ".join(f"{k} {v}x" for k, v in ratio.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workload (well under 3 minutes)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "sandbox_bench.json")
    parser.add_argument("--warm-server", choices=("fork", "reuse"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warm_server:
        serve_warm(fork_per_call=args.warm_server == "fork")
        return
    results = asyncio.run(main_async(args.quick))
    out = report(results, args.quick)
    print_table(out)
    write_report(args.out, out)


if __name__ == "__main__":
    main()
