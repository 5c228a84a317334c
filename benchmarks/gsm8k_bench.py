"""GSM8K test through the harness, on served models side by side: the base model on its own template against the
tool-using default (issue 27).

Each model is started by `rstar serve` as a user starts it, then `rstar eval run --suite gsm8k --endpoint ...`
asks it every test problem (or the first --limit) with the suite's defaults (temperature 0, 0-shot, 5 turns,
2048 tokens); the figures are read back from the harness's own database. Reported per model: accuracy with its
95% Wilson interval, the tool-call rate (answers in which a cell ran) and mean tokens; the paired
difference on the same problems with a 95% bootstrap interval of each tool-using model against each model on its
native template, and of each later tool-using model against the first (a new delta, given as a model directory,
against `default`); for a tool-using model, its misses by kind:

- no call: no cell ran;
- failing cell: cells ran, none ended ok;
- wrong program: a cell ran, none printed the gold number;
- right program, wrong answer: a cell printed the gold number, the boxed answer is something else.

Counted across those kinds: misses with the escape slip, a newline before a name written as `\\b`, `\\f` or `\\c`
inside the call's JSON (`\\bolts` decodes to backspace + `olts`, a cell that cannot run; `\\c` does not decode), and
answers that count one name up (`eggs_2`, `eggs_3`, ... `eggs_122`) until their tokens run out, and answers that end
by writing one stretch again and again (`years_years_years_...`).

Goals (issue 27, for `default`): accuracy >= 10%, tool-call rate >= 95%.

An arm may also set a decoding penalty of `rstar eval run` (`default:rstar::repetition_penalty=1.1`): the same model
with and without it is then a paired comparison on the same problems. An arm that sets none samples with the served
model's recommended penalties (the default model's frequency_penalty; each result records them as
`model_sampling_defaults`), and `default:rstar::frequency_penalty=0` turns that one off.

    python benchmarks/gsm8k_bench.py [--limit N] [--models smollm2-135m-instruct:native:300,default:rstar] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from goals import goal, run_header, write_report

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from rstar.evals.gsm8k import stated_number  # noqa: E402
from rstar.server.db import EvalRun, EvalSample, open_database  # noqa: E402
from served import served  # noqa: E402  (it starts servers with tests/processes.py)

DEFAULT_MODELS = "smollm2-135m-instruct:native:300,default:rstar"  # the base, near 0%, is bounded well enough by 300 answers, and each can run to 2048 tokens
PENALTIES = ("frequency_penalty", "repetition_penalty")  # the `rstar eval run` flags an arm may set
PENALTY_LABELS = {"frequency_penalty": "freq. pen.", "repetition_penalty": "rep. pen."}
FAILURE_KINDS = ("no call", "failing cell", "wrong program", "right program, wrong answer")
EXAMPLES_PER_KIND = 3
EXAMPLE_TEXT_CHARS = 400
NUMBERED_NAME = re.compile(r"\b([A-Za-z_]\w*?)_(\d+)\b")
COUNTED_UP = 8  # no GSM8K training program numbers one name more than 6 times
REPEATED_STRETCH = re.compile(r"(.{3,300}?)\1{3,}", re.DOTALL)  # one stretch written 4 or more times back to back
REPETITION_MIN_CHARS = 40  # a long number's zeros repeat too
REPETITION_TAIL_CHARS = 2000


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (sound near 0, where a 135M model's accuracy sits)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_bootstrap(differences: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean of per-problem differences, problems resampled with replacement."""
    rng = random.Random(seed)
    n = len(differences)
    means = sorted(sum(differences[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return (means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1])


def message_of(sample: EvalSample) -> dict:
    response = (sample.trajectory or {}).get("response") or {}
    choices = response.get("choices") or [{}]
    return choices[0].get("message") or {}


def cells_of(sample: EvalSample) -> list[dict]:
    return message_of(sample).get("code_cells") or []


def failure_kind(sample: EvalSample) -> str | None:
    """Why a tool-template answer missed (one of FAILURE_KINDS); None when it is right."""
    if sample.score > 0:
        return None
    ran = [cell for cell in cells_of(sample) if cell.get("status") != "invalid_input"]
    if not ran:
        return "no call"
    ok = [cell for cell in ran if cell.get("status") == "ok"]
    if not ok:
        return "failing cell"
    gold = Fraction(sample.grade["gold"])
    if any(stated_number(cell.get("stdout")) == gold for cell in ok):
        return "right program, wrong answer"
    return "wrong program"


def has_escape_slip(sample: EvalSample) -> bool:
    """A cell whose code JSON-decoded to a backspace or form feed, or a call that failed on an invalid escape."""
    return any("\b" in (cell.get("code") or "") or "\f" in (cell.get("code") or "")
               or (cell.get("status") == "invalid_input" and "Invalid \\escape" in (cell.get("stderr") or ""))
               for cell in cells_of(sample))


def counts_a_name_up(sample: EvalSample) -> bool:
    """The loop seen in v4's truncated answers: one name numbered on and on (`eggs_2`, `eggs_3`, ... `eggs_122`),
    counted as one stem with COUNTED_UP or more numbers anywhere in the answer's text or cells, more than any
    training program has, so it marks the loop and not the converter's naming."""
    message = message_of(sample)
    text = "\n".join([message.get("reasoning_content") or "", message.get("content") or "", *(c.get("code") or "" for c in cells_of(sample))])
    numbers: dict[str, set[str]] = {}
    for stem, number in NUMBERED_NAME.findall(text):
        numbers.setdefault(stem, set()).add(number)
    return any(len(n) >= COUNTED_UP for n in numbers.values())


def ends_in_repetition(sample: EvalSample) -> bool:
    """The loop seen in v5's truncated answers, where names no longer count up: the answer ends by writing one
    stretch of 3-300 characters 4 or more times back to back (`years_years_years_...`, a block of lines again and
    again), with at most a part of it after. An answer that retries one failing cell with the same words each turn
    ends this way too; the misses by kind tell the two apart."""
    tail = text_end(message_of(sample), REPETITION_TAIL_CHARS)
    return any(len(run.group(0)) >= REPETITION_MIN_CHARS and len(tail) - run.end() <= len(run.group(1))
               for run in REPEATED_STRETCH.finditer(tail))


def loop_counts(samples: list[EvalSample], kinds: dict[str, str], in_loop) -> dict:
    """How many answers `in_loop` marks, how many of those were truncated, and how many of each kind of miss."""
    marked = {s.doc_id for s in samples if in_loop(s)}
    return {"answers": len(marked), "truncated": sum(s.doc_id in marked and bool(s.grade.get("truncated")) for s in samples),
            "misses_by_kind": {kind: sum(k == kind and d in marked for d, k in kinds.items()) for kind in FAILURE_KINDS}}


def text_end(message: dict, chars: int = EXAMPLE_TEXT_CHARS) -> str:
    """The last characters of an answer's reasoning and content: where it stopped, and why."""
    return ((message.get("reasoning_content") or "") + (message.get("content") or ""))[-chars:]


def answer_record(sample: EvalSample) -> dict:
    """One answer in the shape tool_use_bench gives its answers (what rl_recipe_bench pairs and counts)."""
    cells = cells_of(sample)
    return {"id": sample.doc_id, "family": "gsm8k", "accurate": sample.score > 0, "tool_call": sample.num_tool_calls > 0,
            "cells": len(cells), "cell_errors": sum(cell.get("status") != "ok" for cell in cells)}


def parse_penalties(settings: list[str], where: str) -> dict[str, float]:
    """`PENALTY=VALUE` settings of one --models entry (empty ones skipped), as request fields."""
    penalties = {}
    for setting in filter(None, settings):
        key, _, value = setting.partition("=")
        if key not in PENALTIES:
            raise SystemExit(f"{where}: {key!r} is not one of {', '.join(PENALTIES)}")
        penalties[key] = float(value)
    return penalties


def arm_name(model: str, penalties: dict[str, float]) -> str:
    """The arm's name in a report: the model, then each penalty it sends."""
    return " ".join([model, *(f"{k}={v:g}" for k, v in penalties.items())])


def parse_arm(spec: str, limit_of_all: int | None = None) -> dict:
    """One --models entry, MODEL[:TEMPLATE[:LIMIT[:PENALTY=VALUE...]]], as the arm it runs (LIMIT, else --limit's);
    `arm` names it in the report."""
    model, template, limit, *settings = (spec.strip().split(":") + ["", ""])
    penalties = parse_penalties(settings, f"gsm8k_bench: --models {spec!r}")
    return {"arm": arm_name(model, penalties), "model": model,
            "template": template or "rstar", "limit": int(limit) if limit else limit_of_all, "penalties": penalties}


def paired_differences(results: list[dict]) -> list[dict]:
    """Each tool-using model against each model on its native template, and each later tool-using model against the
    first (two deltas side by side), on the problems both answered."""
    tooled = [r for r in results if r["template"] == "rstar"]
    native = [r for r in results if r["template"] != "rstar"]
    pairs = []
    for better, than in [*((t, n) for t in tooled for n in native), *((t, tooled[0]) for t in tooled[1:])]:
        shared = sorted(set(than["scores"]) & set(better["scores"]))
        differences = [better["scores"][d] - than["scores"][d] for d in shared]
        pairs.append({"better": better["arm"], "than": than["arm"], "problems": len(shared),
                      "difference": statistics.fmean(differences), "difference_95": paired_bootstrap(differences)})
    return pairs


def run_harness(arm: dict, data_dir: Path, concurrency: int, work: Path, run_id: str) -> dict:
    """The arm's model served by `rstar serve` and asked GSM8K test (its first `limit` problems) by `rstar eval run`;
    the figures read back from the harness's database, with one record per problem in `answers`, sorted by doc_id."""
    model, template, limit = arm["model"], arm["template"], arm["limit"]
    database_url = f"sqlite:///{work / 'evals.db'}"
    with served(model, work) as server:
        command = [sys.executable, "-m", "rstar.cli", "eval", "run", "--suite", "gsm8k", "--endpoint", f"{server.base_url}/v1",
                   "--template", template, "--data-dir", str(data_dir), "--concurrency", str(concurrency),
                   "--run-id", run_id, "--database-url", database_url]
        if limit:
            command += ["--limit", str(limit)]
        for key, value in arm["penalties"].items():
            command += [f"--{key.replace('_', '-')}", str(value)]
        began = time.perf_counter()
        subprocess.run(command, check=True, env={**os.environ, "RSTAR_DATA_DIR": str(work / "eval-data")})
        wall = time.perf_counter() - began
    with open_database(database_url)() as session:
        samples = session.query(EvalSample).filter_by(run_id=run_id).order_by(EvalSample.id).all()
        model_defaults = session.get(EvalRun, run_id).config.get("model_sampling_defaults")
    right = sum(s.score > 0 for s in samples)
    uses_tool = template == "rstar"
    result = {
        "arm": arm["arm"], "model": model, "template": template, "penalties": arm["penalties"],
        "model_sampling_defaults": model_defaults, "run_id": run_id, "problems": len(samples),
        "accuracy": right / len(samples), "accuracy_95": wilson(right, len(samples)),
        "tool_call_rate": sum(s.num_tool_calls > 0 for s in samples) / len(samples),
        "mean_completion_tokens": statistics.fmean(s.completion_tokens for s in samples),
        "truncated_rate": sum(bool(s.grade.get("truncated")) for s in samples) / len(samples),
        "wall_s": wall, "startup_s": server.startup_s,
        "scores": {s.doc_id: s.score for s in samples},
        "answers": [answer_record(s) for s in sorted(samples, key=lambda s: s.doc_id)],
    }
    if uses_tool:
        kinds = {s.doc_id: failure_kind(s) for s in samples}
        result["misses_by_kind"] = {kind: sum(k == kind for k in kinds.values()) for kind in FAILURE_KINDS}
        result["escape_slip_misses_by_kind"] = {kind: sum(kinds[s.doc_id] == kind and has_escape_slip(s) for s in samples) for kind in FAILURE_KINDS}
        result["counted_up_name"] = loop_counts(samples, kinds, counts_a_name_up)
        result["ends_in_repetition"] = loop_counts(samples, kinds, ends_in_repetition)
        result["miss_examples"] = {
            kind: [{"doc_id": s.doc_id, "gold": s.grade["gold"], "predicted": s.grade.get("predicted"),
                    "code": [c.get("code") for c in cells_of(s)], "stdout": [c.get("stdout") for c in cells_of(s)],
                    "text_end": text_end(message_of(s))}
                   for s in samples if kinds[s.doc_id] == kind][:EXAMPLES_PER_KIND]
            for kind in FAILURE_KINDS
        }
    return result


def arm_label(result: dict) -> str:
    """The arm as a plot names it: model, the penalties it samples with (those it sets, then the served model's
    defaults it left alone), then its template and how many problems."""
    served = {k: v for k, v in (result.get("model_sampling_defaults") or {}).items() if k not in result["penalties"]}
    penalties = [f"{PENALTY_LABELS[key]} {value:g}" for key, value in result["penalties"].items()]
    penalties += [f"{PENALTY_LABELS[key]} {value:g} (served)" for key, value in served.items()]
    return "\n".join([Path(result["model"]).name, *penalties, f"({result['template']}, {result['problems']})"])


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (scores, misses) = plt.subplots(1, 2, figsize=(4 + 1.6 * len(results), 3.8), width_ratios=(1.3, 1))
    labels = [arm_label(r) for r in results]
    accuracy = [100 * r["accuracy"] for r in results]
    errors = [[100 * (r["accuracy"] - r["accuracy_95"][0]) for r in results], [100 * (r["accuracy_95"][1] - r["accuracy"]) for r in results]]
    bars = scores.bar(labels, accuracy, yerr=errors, capsize=4, color="#4c72b0")
    scores.bar_label(bars, fmt="%.1f", fontsize=8)
    scores.tick_params(axis="x", labelsize=7)
    scores.set_ylabel("GSM8K test accuracy, % (95% Wilson)")
    scores.set_title("temperature 0; each arm's problems under its bar", fontsize=9)
    tool_users = [r for r in results if "misses_by_kind" in r]
    height = 0.8 / max(1, len(tool_users))
    for at, r in enumerate(tool_users):  # side by side, so one arm's bar never hides another's
        rows = [k + at * height for k in range(len(FAILURE_KINDS))]
        misses.barh(rows, [r["misses_by_kind"][k] for k in FAILURE_KINDS], height, label=arm_label(r).replace("\n", " "))
    misses.set_yticks([k + height * (len(tool_users) - 1) / 2 for k in range(len(FAILURE_KINDS))], FAILURE_KINDS, fontsize=8)
    misses.set_xlabel("misses")
    misses.set_title("why the tool-using model missed", fontsize=9)
    if tool_users:
        misses.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="only the first N test problems (default: all 1,319)")
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated MODEL[:TEMPLATE[:LIMIT[:PENALTY=VALUE...]]]: template rstar (default) or native, "
                        "LIMIT this model's first N problems instead of --limit's (the paired difference counts the problems both answered), "
                        f"PENALTY one of {', '.join(PENALTIES)}")
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gsm8k_bench.json"))
    args = parser.parse_args()
    began, load_before = time.perf_counter(), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="gsm8k-bench-"))
    results = []
    for index, arm in enumerate(parse_arm(spec, args.limit) for spec in args.models.split(",")):
        print(f"serving {arm['arm']} ({arm['template']} template) ...", flush=True)
        result = run_harness(arm, args.data_dir, args.concurrency, work, f"gsm8k-{index}-{arm['template']}")
        low, high = result["accuracy_95"]
        print(f"{arm['arm']}: accuracy {result['accuracy']:.1%} (95% {low:.1%}-{high:.1%}), tool call {result['tool_call_rate']:.1%}, "
              f"{result['problems']} problems in {result['wall_s']:.0f} s", flush=True)
        results.append(result)

    pairs = paired_differences(results)
    default = next((r for r in results if r["model"] == "default" and not r["penalties"]), None)  # as the suite decodes
    goals = [] if default is None else [
        goal("default: GSM8K test accuracy", round(default["accuracy"], 4), ">=", 0.10, "share"),
        goal("default: tool-call rate", round(default["tool_call_rate"], 4), ">=", 0.95, "share"),
    ]
    report = {**run_header("gsm8k_bench", began, load_before, quick=False),
              "settings": {"limit": args.limit, "concurrency": args.concurrency, "suite_defaults": "temperature 0, 1 sample, 5 turns, 2048 tokens"},
              "results": results, "paired": pairs, "goals": goals}
    write_report(args.out, report)
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.png')}")
    shutil.rmtree(work)  # the servers' logs and the harness's database; kept when a run fails


if __name__ == "__main__":
    main()
