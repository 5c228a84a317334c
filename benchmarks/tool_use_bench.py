"""Does the model use its tool? Held-out problems through the API, temperature 0, several models side by side.

Each model is served by `rstar serve` as a user starts it (a fresh process on a free port), asked every
held-out problem of `rstar rl make-sft-data` (phrasings the SFT and RL data never use) through the chat
completions endpoint, and scored on what came back:

- tool call: the answer's first code cell parsed as a call and ran (`message.code_cells`, status not invalid_input);
- accurate: the final `\\boxed{}` answer (inside `<answer>`) equals the problem's answer;
- accurate after a tool result: accurate, and at least one cell ran before the answer.

Default models: `smollm2-135m-instruct` (the untuned base) and `default` (the base with the shipped tool-use
delta); pass `--models` to add RL checkpoints (directories). Goals (for `default`): tool call in
>= 95% of answers, accuracy >= 80%. An entry may set decoding penalties sent with every request
(`default:frequency_penalty=0`): the same model with and without them is then a paired comparison.

    python benchmarks/tool_use_bench.py [--quick] [--out FILE.json] [--models a,b:frequency_penalty=0.1,DIR] [--heldout FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
from goals import goal, write_report
from gsm8k_bench import arm_name, paired_bootstrap, parse_penalties

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from rstar.hardware import cpu_info  # noqa: E402
from rstar.sandbox.verify import extract_answer  # noqa: E402
from served import served  # noqa: E402  (it starts servers with tests/processes.py)

MAX_TOKENS = 512
MAX_TURNS = 3


def heldout_problems(path: Path | None, count: int) -> tuple[list[dict], str]:
    """The held-out rows: from a file, or generated with the product's own command (seed 0)."""
    if path is None:
        with tempfile.TemporaryDirectory(prefix="tool-use-bench-") as work:
            subprocess.run([sys.executable, "-m", "rstar.cli", "rl", "make-sft-data", "--out", work, "--train", "1", "--heldout", str(count), "--rl", "1"],
                           check=True, capture_output=True)
            text = (Path(work) / "heldout.jsonl").read_text()
        source = "rstar rl make-sft-data --seed 0"
    else:
        text, source = path.read_text(), str(path)
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return rows[:count], source


async def ask(client: httpx.AsyncClient, problem: dict, gate: asyncio.Semaphore, penalties: dict[str, float]) -> dict:
    async with gate:
        started = time.perf_counter()
        response = await client.post("/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": problem["problem"]}],
            "temperature": 0, "max_tokens": MAX_TOKENS, "max_turns": MAX_TURNS, **penalties,
        })
        seconds = time.perf_counter() - started
    response.raise_for_status()
    message = response.json()["choices"][0]["message"]
    cells = message.get("code_cells") or []
    ran = [cell for cell in cells if cell.get("status") != "invalid_input"]
    predicted = extract_answer(message.get("content") or "")
    accurate = predicted is not None and predicted.replace(",", "") == problem["answer"]
    return {
        "id": problem["id"], "family": problem.get("family"), "phrasing": problem.get("phrasing"), "answer": problem["answer"], "predicted": predicted,
        "tool_call": bool(ran), "cells": len(cells), "cell_errors": sum(cell.get("status") != "ok" for cell in cells),
        "accurate": accurate, "accurate_after_tool": accurate and bool(ran), "seconds": seconds,
        "completion_tokens": response.json()["usage"]["completion_tokens"],
    }


def parse_entry(spec: str) -> tuple[str, str, dict[str, float]]:
    """One --models entry, MODEL[:PENALTY=VALUE...], as (model, the arm's name in the report, penalties)."""
    model, *settings = spec.strip().split(":")
    penalties = parse_penalties(settings, f"tool_use_bench: --models {spec!r}")
    return model, arm_name(model, penalties), penalties


def evaluate(spec: str, problems: list[dict], concurrency: int, log_dir: Path) -> dict:
    model, arm, penalties = parse_entry(spec)
    with served(model, log_dir) as server:
        model_defaults = httpx.get(f"{server.base_url}/v1/models").json()["data"][0].get("sampling_defaults")  # where the arm sets none

        async def run_all():
            gate = asyncio.Semaphore(concurrency)
            async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as client:
                return await asyncio.gather(*(ask(client, p, gate, penalties) for p in problems))

        began = time.perf_counter()
        answers = asyncio.run(run_all())
        wall = time.perf_counter() - began

    def rate(key: str) -> float:
        return sum(a[key] for a in answers) / len(answers)

    def accuracy_by(key: str) -> dict[str, float]:
        groups = sorted({a[key] for a in answers if a[key] is not None})
        return {g: statistics.fmean(a["accurate"] for a in answers if a[key] == g) for g in groups}

    return {
        "model": model,
        "arm": arm,
        "penalties": penalties,
        "model_sampling_defaults": model_defaults,
        "problems": len(answers),
        "tool_call_rate": rate("tool_call"),
        "accuracy": rate("accurate"),
        "accuracy_after_tool": rate("accurate_after_tool"),
        "cell_error_rate": sum(a["cell_errors"] for a in answers) / max(1, sum(a["cells"] for a in answers)),
        "per_family_accuracy": accuracy_by("family"),
        "per_phrasing_accuracy": accuracy_by("phrasing"),  # held-out phrasings succeed or fail as a whole
        "median_seconds": statistics.median(a["seconds"] for a in answers),
        "mean_completion_tokens": statistics.fmean(a["completion_tokens"] for a in answers),
        "wall_s": wall,
        "startup_s": server.startup_s,
        "answers": answers,
    }


def paired(results: list[dict]) -> list[dict]:
    """Each later arm of a model against that model's first arm (with and without a penalty), on the same
    problems: the mean per-problem difference of each score with its 95% bootstrap interval."""
    pairs = []
    for at, arm in enumerate(results):
        first = next(r for r in results[: at + 1] if r["model"] == arm["model"])
        if first is arm:
            continue
        before = {a["id"]: a for a in first["answers"]}
        row = {"better": arm["arm"], "than": first["arm"], "problems": len(arm["answers"])}
        for key in ("tool_call", "accurate"):
            differences = [float(a[key]) - float(before[a["id"]][key]) for a in arm["answers"]]
            row[key] = {"difference": statistics.fmean(differences), "difference_95": paired_bootstrap(differences)}
        pairs.append(row)
    return pairs


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["\n".join([Path(r["model"]).name, *r["arm"].split(" ")[1:]]) for r in results]
    metrics = ("tool_call_rate", "accuracy_after_tool", "accuracy")
    figure, axis = plt.subplots(figsize=(2.4 + 1.6 * len(results), 3.6))
    width = 0.8 / len(metrics)
    for i, metric in enumerate(metrics):
        values = [100 * r[metric] for r in results]
        bars = axis.bar([x + i * width for x in range(len(results))], values, width, label=metric.replace("_", " "))
        axis.bar_label(bars, fmt="%.0f", fontsize=7)
    axis.set_xticks([x + width for x in range(len(results))], labels, fontsize=8)
    axis.set_ylabel("% of held-out problems")
    axis.set_ylim(0, 110)
    axis.legend(fontsize=7)
    axis.set_title(f"held-out problems, temperature 0 ({results[0]['problems']} each)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="40 problems per model")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/tool_use_bench.json"))
    parser.add_argument("--models", default="smollm2-135m-instruct,default", help="comma-separated: embedded names or model directories")
    parser.add_argument("--heldout", type=Path, default=None, help="heldout.jsonl of `rstar rl make-sft-data` (default: generate it, seed 0)")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    problems, source = heldout_problems(args.heldout, 40 if args.quick else 200)
    log_dir = Path(tempfile.mkdtemp(prefix="tool-use-bench-logs-"))
    results = []
    for spec in args.models.split(","):
        print(f"serving {spec} ...", flush=True)
        result = evaluate(spec, problems, args.concurrency, log_dir)
        print(f"{result['arm']}: tool call {result['tool_call_rate']:.1%}, accuracy {result['accuracy']:.1%}, after a tool result {result['accuracy_after_tool']:.1%} "
              f"({result['problems']} problems, {result['wall_s']:.0f} s, start-up {result['startup_s']:.0f} s)", flush=True)
        results.append(result)
    pairs = paired(results)
    for pair in pairs:
        print(f"{pair['better']} - {pair['than']}: " + ", ".join(
            f"{key} {100 * pair[key]['difference']:+.1f} ({100 * pair[key]['difference_95'][0]:+.1f} to {100 * pair[key]['difference_95'][1]:+.1f})" for key in ("tool_call", "accurate")), flush=True)
    default = next((r for r in results if r["arm"] == "default"), None)  # as served, no penalty sent
    goals = []
    if default is not None:
        goals = [
            goal("default: well-formed tool call", round(default["tool_call_rate"], 4), ">=", 0.95, "share"),
            goal("default: accuracy after a tool result", round(default["accuracy_after_tool"], 4), ">=", 0.80, "share"),
        ]
    output = {
        "benchmark": "tool_use_bench",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_info().to_dict(),
        "heldout": source,
        "settings": {"temperature": 0, "max_tokens": MAX_TOKENS, "max_turns": MAX_TURNS, "concurrency": args.concurrency, "quick": args.quick},
        "results": results,
        "paired": pairs,
        "goals": goals,
    }
    write_report(args.out, output)
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.png')}")
    shutil.rmtree(log_dir)  # the servers' logs and data; kept when a run fails


if __name__ == "__main__":
    main()
