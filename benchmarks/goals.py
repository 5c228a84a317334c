"""The `goals` list each benchmark writes into its JSON: one entry per goal it measures, in the shape
benchmarks/README.md gives. Built, written and reported here, so each script states only its names and figures."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Literal

Op = Literal["<=", ">="]


def goal(name: str, value: float | None, op: Op, target: float, unit: str) -> dict:
    """One goal entry; `value` is None when the run could not measure it."""
    if op not in ("<=", ">="):
        raise ValueError(f"a goal compares with '<=' or '>=', not {op!r}")
    return {"name": name, "value": value, "op": op, "target": target, "unit": unit}


def met(entry: dict) -> bool | None:
    """Whether a goal entry is met; None when it was not measured."""
    value = entry["value"]
    if value is None:
        return None
    return value <= entry["target"] if entry["op"] == "<=" else value >= entry["target"]


def print_goals(goals: list[dict]) -> None:
    """One line a goal: its figure beside its target, and whether it is met (a benchmark measures, it does not judge)."""
    for entry in goals:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[met(entry)]
        print(f"goal {entry['name']}: {entry['value']} {entry['op']} {entry['target']} {entry['unit']}: {verdict}")


def run_header(benchmark: str, began: float, load_before: tuple[float, ...], quick: bool) -> dict:
    """What every benchmark JSON opens with: which run, on which machine and CPU, how loaded it was, how long."""
    import os
    import platform
    import time
    from datetime import datetime, timezone

    from rstar.hardware import cpu_info

    return {
        "benchmark": benchmark,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
        "cpu": cpu_info().to_dict(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "quick": quick,
        "wall_s": time.perf_counter() - began,
    }


def percentiles_ms(seconds: list[float], digits: int = 1) -> tuple[float, float]:
    """p50 and p95 of durations in seconds, in milliseconds."""
    ordered = sorted(seconds)
    return round(statistics.median(ordered) * 1000, digits), round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, digits)


def write_report(path: Path, report: dict) -> None:
    """Write a benchmark's JSON (its figures and `goals`), then print the goals and where it went."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print_goals(report["goals"])
    print(f"wrote {path}")
