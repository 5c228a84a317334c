"""Reports for a run: report.json, report.md and three PNG plots, written to the run directory.

Only aggregates and per-sample counts go into reports, never prompt or response text (GPQA's authors ask that
its questions never appear in plain text online; reports are made to be shared).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rstar.evals.runner import SampleStats

FILES = ("report.json", "report.md", "scores.png", "lengths.png", "tool_calls.png")


def score_text(entry: dict[str, Any]) -> str:
    if "score" not in entry:
        return "-"
    stderr = entry.get("stderr")
    return f"{100 * entry['score']:.1f}" + (f" ± {100 * stderr:.1f}" if stderr is not None else "")


def markdown(run: dict[str, Any], summary: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"# Eval run {run['id']}",
        "",
        f"- model: {run['model']}",
        f"- endpoint: {run['endpoint'] or 'in-process'}",
        f"- status: {run['status']}",
        f"- created: {run['created_at']}" + (f", finished: {run['finished_at']}" if run.get("finished_at") else ""),
        "",
        f"- answer extraction (math): {run['config'].get('answer_extraction', 'paper')}",
        "",
        "| benchmark | metric | score (± s.e.) | samples | k | temp | max tokens | truncated | mean tokens | mean turns | mean tool calls |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in summary.items():
        sampling = run["config"]["benchmarks"][name]
        samples = f"{entry['samples']}/{entry['expected_samples']}"
        means = [f"{entry[key]:.1f}" if key in entry else "-" for key in ("mean_completion_tokens", "mean_num_turns", "mean_num_tool_calls")]
        rate = entry.get("truncation_rate")
        truncated = f"{100 * rate:.1f}%" if rate is not None else "-"
        lines.append(
            f"| {name} | {entry['primary_metric']} | {score_text(entry)} | {samples} | {sampling['samples']} | {sampling['temperature']} | {sampling['max_tokens']} | {truncated} | {' | '.join(means)} |"
        )
    lines += [
        "",
        "Scores in percent; s.e. is the standard error over docs (k samples of a doc are averaged first).",
        "Truncated: share of samples cut off by the token budget or the turn limit instead of ending their answer.",
    ]
    return "\n".join(lines) + "\n"


def write(run_dir: Path, run: dict[str, Any], summary: dict[str, dict[str, Any]], stats: list[SampleStats]) -> list[Path]:
    """All report files; `run` is the run's row as a dict (id, model, endpoint, status, config, dates)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "report.json").write_text(json.dumps({"run": run, "benchmarks": summary}, indent=2, default=str), encoding="utf-8")
    (run_dir / "report.md").write_text(markdown(run, summary), encoding="utf-8")
    _plots(run_dir, summary, stats)
    return [run_dir / name for name in FILES]


def scores_figure(summary: dict[str, dict[str, Any]]):
    """The scores chart: one bar per benchmark, named with the metric it reports, ±1 s.e. error bars.

    Benchmarks report different metrics (avg@k, prompt-level strict accuracy, BFCL overall), so each bar's tick
    names both; the UI shows the same figure. A benchmark without a score yet draws an empty bar at 0."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, ax = plt.subplots(figsize=(max(4, 1.5 * len(names)), 3.8))
    scores = [100 * summary[n].get("score", 0.0) for n in names]
    errors = [100 * (summary[n].get("stderr") or 0.0) for n in names]
    ticks = [f"{n}\n{summary[n].get('primary_metric', 'score')}" for n in names]
    bars = ax.bar(ticks, scores, yerr=errors, capsize=4, color="steelblue", ecolor="black")
    ax.bar_label(bars, labels=[f"{score:.1f}" if "score" in summary[n] else "-" for n, score in zip(names, scores)], padding=2)
    ax.set_ylabel("score (%): primary metric ± 1 s.e.")
    ax.set_ylim(0, 100)
    ax.set_title("Primary metric per benchmark")
    ax.tick_params(axis="x", labelsize="small")
    fig.tight_layout()
    return fig


def _plots(run_dir: Path, summary: dict[str, dict[str, Any]], stats: list[SampleStats]) -> None:
    import matplotlib.pyplot as plt

    names = list(summary)
    fig = scores_figure(summary)
    fig.savefig(run_dir / "scores.png", dpi=100)
    plt.close(fig)

    for filename, key, label in (
        ("lengths.png", "completion_tokens", "response length (sampled tokens)"),
        ("tool_calls.png", "num_tool_calls", "tool calls per sample"),
    ):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        present = [n for n in names if any(s.benchmark == n for s in stats)]
        if present:
            values = [[getattr(s, key) for s in stats if s.benchmark == n] for n in present]
            top = max(max(v) for v in values)
            # Shared bins, so the benchmarks' bars line up; small counts get one bin per integer.
            bins = [b - 0.5 for b in range(top + 2)] if top < 30 else 30
            ax.hist(values, bins=bins, label=present)
            ax.legend(fontsize="small")
        ax.set_xlabel(label)
        ax.set_ylabel("samples")
        fig.tight_layout()
        fig.savefig(run_dir / filename, dpi=100)
        plt.close(fig)


def run_row(run: Any) -> dict[str, Any]:
    """The parts of an EvalRun a report shows."""
    return {
        "id": run.id,
        "model": run.model,
        "endpoint": run.endpoint,
        "status": run.status,
        "suite": run.suite,
        "config": run.config,
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


def write_run_reports(store: Any, run_id: str, runs_root: Path) -> Path:
    """Write the reports of a stored run to `runs_root/<run id>/` and record that directory on the run."""
    run = store.get(run_id)
    run_dir = Path(runs_root) / run_id
    write(run_dir, run_row(run), run.summary, store.stats(run_id))
    store.update(run_id, run_dir=str(run_dir))
    return run_dir
