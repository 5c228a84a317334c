"""Eval harness cost: bookkeeping per sample (model time excluded), and IFEval scoring, ours vs lm-eval's.

Measured, in one run:
  overhead  the runner (`rstar.evals.runner.execute`) with a chat client that answers instantly, into a fresh
            SQLite database: per sample, prompt building + grading + storing (one transaction each) + summary,
            for each benchmark, after one warm-up grade (what a process loads once: checkers, NLTK, langdetect)
  ifeval    scoring the same 541 responses (deterministic synthetic ones: the prompt echoed in four styles)
            ours: `get_benchmark("ifeval").grade` on each + `aggregate`
            lm-eval: its ifeval task's functions (`utils.process_results` on each + its aggregations), in a
            process of its own with lm-eval's defaults; rounds alternate, the median of each is reported

    python benchmarks/eval_bench.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from goals import goal, write_report

from rstar.evals import get_benchmark
from rstar.evals.client import Completion
from rstar.evals.runner import RunStore, execute, plan
from rstar.server.db import open_database

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("RSTAR_TEST_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))

# Per benchmark: (docs limit, samples per doc); BFCL's limit is per category.
FULL = {"aime24": (None, 16), "hmmt25": (None, 4), "gpqa_diamond": (None, 1), "ifeval": (None, 1), "bfcl_v3": (20, 1)}
QUICK = {"aime24": (None, 2), "gpqa_diamond": (50, 1), "ifeval": (100, 1), "bfcl_v3": (3, 1)}

ANSWER = "I think it is this one.\n<answer>\\boxed{42}</answer>\nAnswer: B"

# lm-eval's scoring, run as lm-eval runs it (nothing of ours imported, so langdetect keeps lm-eval's defaults).
LM_EVAL_SCORER = """
import json, sys, time
from statistics import mean
from lm_eval.tasks.ifeval import utils
docs, responses = json.load(open(sys.argv[1]))
utils.process_results(docs[0], [responses[0]])  # warm-up: loads langdetect's profiles and NLTK's punkt
start = time.perf_counter()
results = [utils.process_results(doc, [response]) for doc, response in zip(docs, responses)]
scores = {"prompt_level_strict_acc": mean(r["prompt_level_strict_acc"] for r in results),
          "inst_level_strict_acc": utils.agg_inst_level_acc([r["inst_level_strict_acc"] for r in results])}
print(json.dumps({"seconds": time.perf_counter() - start, "scores": scores}))
"""


class InstantClient:
    """Answers every request at once with the same short text and no tool calls."""

    async def complete(self, messages, tools, params) -> Completion:
        return Completion(ANSWER, [], 50, 20, 1, 0, "stop", {"text": ANSWER})


def harness_overhead(workload: dict) -> dict:
    results = {}
    for name, (limit, samples) in workload.items():
        bench = get_benchmark(name)
        docs = bench.load(DATA_DIR)
        bench.grade(docs[0], [] if name == "bfcl_v3" else ANSWER, 0)  # once-per-process loads (checkers, NLTK, langdetect)
        with tempfile.TemporaryDirectory() as tmp:
            store = RunStore(open_database(f"sqlite:///{tmp}/bench.db"))
            config = {"benchmarks": plan([name], {"samples": samples}), "limit": limit, "data_dir": None, "seed": 0}
            run = store.create(None, "instant", "", [bench.name], config)
            start = time.perf_counter()
            outcome = asyncio.run(execute(store, run, InstantClient(), concurrency=16, docs={bench.name: docs}))
            elapsed = time.perf_counter() - start
        results[bench.name] = {"samples": outcome.generated, "seconds": round(elapsed, 3), "ms_per_sample": round(1000 * elapsed / outcome.generated, 3)}
        print(f"overhead {bench.name:14} {outcome.generated:5d} samples  {results[bench.name]['ms_per_sample']:8.2f} ms/sample", flush=True)
    total_samples = sum(r["samples"] for r in results.values())
    total_seconds = sum(r["seconds"] for r in results.values())
    return {"benchmarks": results, "ms_per_sample": round(1000 * total_seconds / total_samples, 3), "samples": total_samples}


def ifeval_responses(docs: list[dict]) -> list[str]:
    styles = (
        lambda p: p,
        lambda p: p.lower().replace(",", ""),
        lambda p: f'"{p.upper()}"',
        lambda p: f"Sure!\n{p}\n\n* point one\n* point two\nP.S. that is all",
    )
    return [styles[i % len(styles)](doc["prompt"]) for i, doc in enumerate(docs)]


def ours_scoring(bench, docs: list[dict], responses: list[str]) -> tuple[float, dict]:
    from lm_eval.tasks.ifeval import instructions

    instructions.langdetect.detect.cache_clear()  # every round starts cold: no detection carried over
    start = time.perf_counter()
    scores = bench.aggregate([bench.grade(doc, response, 0) for doc, response in zip(docs, responses)])
    return time.perf_counter() - start, scores


def lm_eval_scoring(payload: Path) -> tuple[float, dict]:
    result = subprocess.run([sys.executable, "-c", LM_EVAL_SCORER, str(payload)], capture_output=True, text=True, check=True)
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    return measured["seconds"], measured["scores"]


def ifeval_scoring(rounds: int) -> dict:
    bench = get_benchmark("ifeval")
    docs = bench.load(DATA_DIR)
    responses = ifeval_responses(docs)
    bench.grade(docs[0], responses[0], 0)  # warm-up, as the lm-eval side does
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        payload = Path(tmp) / "responses.json"
        payload.write_text(json.dumps([docs, responses]))
        for round_ in range(rounds):
            seconds, our_scores = ours_scoring(bench, docs, responses)
            ours.append(seconds)
            seconds, their_scores = lm_eval_scoring(payload)
            theirs.append(seconds)
            print(f"ifeval round {round_ + 1}/{rounds}: ours {ours[-1]:.3f} s, lm-eval {theirs[-1]:.3f} s", flush=True)
    return {
        "responses": len(responses),
        "rounds": rounds,
        "ours_s": [round(s, 4) for s in ours],
        "lm_eval_s": [round(s, 4) for s in theirs],
        "ours_median_s": round(statistics.median(ours), 4),
        "lm_eval_median_s": round(statistics.median(theirs), 4),
        # prompt-level strict can differ only where lm-eval's unseeded langdetect or letter draws disagree
        "ours_prompt_level_strict_acc": our_scores["prompt_level_strict_acc"],
        "lm_eval_prompt_level_strict_acc": their_scores["prompt_level_strict_acc"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workload (under 3 minutes)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "eval_bench.json")
    args = parser.parse_args()

    overhead = harness_overhead(QUICK if args.quick else FULL)
    scoring = ifeval_scoring(rounds=2 if args.quick else 7)
    ratio = scoring["ours_median_s"] / scoring["lm_eval_median_s"]
    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "quick": args.quick,
        "harness_overhead": overhead,
        "ifeval_scoring": scoring,
        "goals": [
            goal("ifeval_scoring_541_time_ours_over_lm_eval", round(ratio, 3), "<=", 1.0, "x"),
        ],
    }
    print(f"harness overhead: {overhead['ms_per_sample']:.2f} ms/sample over {overhead['samples']} samples")
    print(f"ifeval scoring of {scoring['responses']} responses: ours {scoring['ours_median_s']:.3f} s, lm-eval {scoring['lm_eval_median_s']:.3f} s (ratio {ratio:.2f})")
    write_report(args.out, out)


if __name__ == "__main__":
    main()
