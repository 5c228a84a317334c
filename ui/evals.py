"""The Evaluations tab: runs, a run's scores and plots, its samples, and one sample's full trajectory."""

from __future__ import annotations

import io
from typing import Any

import gradio as gr
from PIL import Image

from rstar.ui.chat import answers_chatbot, listed_choices, notice
from rstar.ui.client import ApiClient, ApiError
from rstar.ui.render import sample_messages, scores_caption, scores_table

# The plots the eval runner writes into a run's directory, shown side by side when present.
PLOTS = {"scores.png": "Scores", "lengths.png": "Response lengths", "tool_calls.png": "Tool calls"}
SAMPLE_COLUMNS = ["id", "benchmark", "doc", "sample", "score", "turns", "tool calls", "tokens"]
PAGE_SIZE = 100


def run_choices(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(f"{_when(r.get('created_at'))[:16]} · {r['model']} · {', '.join(r.get('suite') or [])} · {r['status']}", r["id"]) for r in runs]


def _when(stamp: str | None) -> str:
    return stamp[:19].replace("T", " ") if stamp else "—"


def run_header(run: dict[str, Any]) -> str:
    graded = ", ".join(f"{name}: {counts['count']} samples" for name, counts in (run.get("samples") or {}).items()) or "no samples yet"
    lines = [
        f"### Run `{run['id']}`",
        f"**{run['status']}** · model `{run['model']}` · {run.get('endpoint') or 'in-process engine'}",
        f"started {_when(run.get('created_at'))} · finished {_when(run.get('finished_at'))} · {graded}",
    ]
    return "\n\n".join(lines)


def sample_rows(samples: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [s["id"], s["benchmark"], s["doc_id"], s["sample_index"], s["score"], s["num_turns"], s["num_tool_calls"], s["prompt_tokens"] + s["completion_tokens"]]
        for s in samples
    ]


def build_evals_tab(client: ApiClient, demo: gr.Blocks) -> None:
    """Lay out the tab inside the current Blocks context and wire its events (and `demo`'s page load)."""
    alert = gr.Markdown(elem_id="evals-notice")
    with gr.Row():
        runs = gr.Dropdown(label="Eval runs", choices=[], value=None, scale=6, elem_id="eval-runs")
        refresh = gr.Button("↻ Refresh", scale=1, elem_id="refresh-runs")
    header = gr.Markdown(elem_id="run-header")
    scores = gr.Dataframe(headers=["benchmark", "score"], label="Scores", interactive=False, elem_id="scores")
    with gr.Row(elem_id="plots"):
        plots = [gr.Image(label=label, visible=False, interactive=False, height=300, elem_id=f"plot-{name.removesuffix('.png')}") for name, label in PLOTS.items()]
    with gr.Accordion("Report", open=False):
        report = gr.Markdown(elem_id="report")
    with gr.Row():
        benchmark = gr.Dropdown(label="Benchmark", choices=[], value=None, scale=3, elem_id="benchmark-filter")
        page = gr.Number(label="Page", value=1, minimum=1, precision=0, scale=1)
        sample_id = gr.Number(label="Sample id", value=None, precision=0, scale=1, elem_id="sample-id")
        open_sample = gr.Button("Open sample", scale=1, elem_id="open-sample")
    samples = gr.Dataframe(headers=SAMPLE_COLUMNS, label="Samples (click a row to open it)", interactive=False, elem_id="samples")
    trajectory = answers_chatbot(elem_id="sample-trajectory", height=600, autoscroll=False)

    async def list_runs(selected):
        return await listed_choices(client.eval_runs(), run_choices, selected, empty="No eval runs yet: start one with `rstar eval run`.")

    async def show_run(run_id):
        if not run_id:
            return "", None, *[gr.update(visible=False)] * len(PLOTS), "", gr.update(choices=[], value=None), [], [], ""
        try:
            run = await client.eval_run(run_id)
            images = {name: Image.open(io.BytesIO(await client.eval_file(run_id, name))) for name in PLOTS if name in run["files"]}
            report_text = (await client.eval_file(run_id, "report.md")).decode() if "report.md" in run["files"] else "*(no report yet)*"
            listed = await client.eval_samples(run_id, limit=PAGE_SIZE)
        except ApiError as exc:
            return gr.skip(), gr.skip(), *[gr.skip()] * len(PLOTS), gr.skip(), gr.skip(), gr.skip(), gr.skip(), notice(str(exc))
        headers, rows = scores_table(run.get("summary") or {})
        table = {"headers": headers, "data": rows} if rows else None
        benchmarks = sorted(run.get("samples") or {})
        labels = {**PLOTS, "scores.png": scores_caption(run.get("summary") or {})}
        shown = [gr.update(value=images.get(name), visible=name in images, label=labels[name]) for name in PLOTS]
        # The previous run's open sample goes: the drill-down always belongs to the run shown above it.
        return run_header(run), table, *shown, report_text, gr.update(choices=["(all)", *benchmarks], value="(all)"), sample_rows(listed["data"]), [], ""

    async def list_samples(run_id, name, page_number):
        if not run_id:
            return [], ""
        try:
            offset = (max(int(page_number or 1), 1) - 1) * PAGE_SIZE
            listed = await client.eval_samples(run_id, None if name in (None, "(all)") else name, PAGE_SIZE, offset)
        except ApiError as exc:
            return gr.skip(), notice(str(exc))
        return sample_rows(listed["data"]), ""

    async def show_sample(run_id, chosen):
        if not run_id or chosen is None:
            return gr.skip(), notice("Choose a run and a sample first.")
        try:
            sample = await client.eval_sample(run_id, int(chosen))
        except ApiError as exc:
            return gr.skip(), notice(str(exc))
        return sample_messages(sample), ""

    def pick_row(evt: gr.SelectData):
        # The id is the table's first column, whichever cell of the row was clicked.
        return evt.row_value[0]

    refresh.click(list_runs, runs, [runs, alert])
    runs.change(show_run, runs, [header, scores, *plots, report, benchmark, samples, trajectory, alert])
    benchmark.input(list_samples, [runs, benchmark, page], [samples, alert])
    page.submit(list_samples, [runs, benchmark, page], [samples, alert])
    samples.select(pick_row, None, sample_id).then(show_sample, [runs, sample_id], [trajectory, alert])
    open_sample.click(show_sample, [runs, sample_id], [trajectory, alert])
    demo.load(list_runs, runs, [runs, alert])
