"""The Training tab: RL runs on this server (or started from the CLI on the same database), their live
curves and last step, and a form to start a GRPO-RoC run on the serving engine or cancel one."""

from __future__ import annotations

from typing import Any

import gradio as gr
import pandas as pd

from rstar.ui.chat import listed_choices, notice
from rstar.ui.client import ApiClient, ApiError

# (title, metrics) of each chart; a chart shows the metrics the run's steps carry.
CURVES = {
    "Reward": ("reward_mean", "solve_rate"),
    "Tool use": ("tool_call_rate", "tool_error_rate_kept_positive", "tool_error_rate_kept_negative"),
    "Tokens per sample": ("sampled_tokens_mean",),
    "Seconds per step": ("rollout_s", "reward_s", "train_s", "sync_s"),
}
REFRESH_S = 5.0
LAST_STEP_KEYS = ("reward_mean", "solve_rate", "groups_kept", "traces_kept", "tool_call_rate", "tool_error_rate_kept_positive",
                  "clip_frac", "grad_norm", "logprob_gap", "probe_gap", "weight_version", "step_s")


def run_choices(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(f"{r['id']} · {r['kind']} · {r['status']} · step {r['step']}/{r['total_steps']}", r["id"]) for r in runs]


def run_header(run: dict[str, Any]) -> str:
    lines = [
        f"### Run `{run['id']}` ({run['kind']})",
        f"**{run['status']}** · step {run['step']}/{run['total_steps']} · model `{run['model']}` · data `{run['data']}`",
    ]
    if run.get("error"):
        lines.append(f"error: `{run['error']}`")
    if run.get("checkpoints"):
        lines.append("checkpoints: " + ", ".join(f"`{c['path']}`" for c in run["checkpoints"]))
    return "\n\n".join(lines)


def curve_frame(steps: list[dict[str, Any]], metrics: tuple[str, ...]) -> pd.DataFrame:
    """Long format for a Gradio line plot: one row per (step, metric) the steps carry."""
    rows = [{"step": s["step"], "metric": m, "value": float(s[m])} for s in steps for m in metrics if isinstance(s.get(m), (int, float))]
    return pd.DataFrame(rows, columns=["step", "metric", "value"])


def last_step_rows(steps: list[dict[str, Any]]) -> list[list[Any]]:
    if not steps:
        return []
    last = steps[-1]
    return [[key, round(last[key], 4) if isinstance(last[key], float) else last[key]] for key in LAST_STEP_KEYS if last.get(key) is not None]


def build_training_tab(client: ApiClient, demo: gr.Blocks) -> None:
    alert = gr.Markdown(elem_id="training-notice")
    with gr.Row():
        runs = gr.Dropdown(label="RL runs", choices=[], value=None, scale=6, elem_id="rl-runs")
        refresh = gr.Button("↻ Refresh", scale=1, elem_id="refresh-rl-runs")
        cancel = gr.Button("Cancel run", scale=1, variant="stop", elem_id="cancel-rl-run")
    header = gr.Markdown(elem_id="rl-run-header")
    with gr.Row():
        charts = [gr.LinePlot(x="step", y="value", color="metric", title=title, height=240, elem_id=f"rl-curve-{i}") for i, title in enumerate(CURVES)]
    last_step = gr.Dataframe(headers=["metric", "last step"], label="Last step", interactive=False, elem_id="rl-last-step")
    with gr.Accordion("Start a GRPO-RoC run on this server's engine", open=False):
        with gr.Row():
            recipe = gr.Textbox(label="Recipe (a shipped name or a TOML path on the server)", value="cpu", elem_id="rl-recipe")
            data = gr.Textbox(label="Problems (a JSONL path on the server)", elem_id="rl-data")
            run_id = gr.Textbox(label="Run id (optional)", elem_id="rl-run-id")
        start = gr.Button("Start", variant="primary", elem_id="start-rl-run")
    timer = gr.Timer(REFRESH_S)

    async def list_runs(selected):
        return await listed_choices(client.rl_runs(), run_choices, selected, empty="No RL runs yet.", first=True)

    async def show_run(run_id_value):
        if not run_id_value:
            return "", *[None] * len(CURVES), [], ""
        try:
            run = await client.rl_run(run_id_value)
        except ApiError as exc:
            return gr.skip(), *[gr.skip()] * len(CURVES), gr.skip(), notice(str(exc))
        steps = run.get("steps") or []
        return run_header(run), *[curve_frame(steps, metrics) for metrics in CURVES.values()], last_step_rows(steps), ""

    async def start_run(recipe_value, data_value, run_id_value):
        payload = {"recipe": recipe_value.strip(), "data": data_value.strip()}
        if run_id_value.strip():
            payload["run_id"] = run_id_value.strip()
        try:
            run = await client.start_rl_run(payload)
        except ApiError as exc:
            return gr.skip(), notice(str(exc))
        return gr.update(choices=[(run["id"], run["id"])], value=run["id"]), f"Started run `{run['id']}`."

    async def cancel_run(run_id_value):
        if not run_id_value:
            return notice("Choose a run first.")
        try:
            run = await client.cancel_rl_run(run_id_value)
        except ApiError as exc:
            return notice(str(exc))
        return f"Run `{run['id']}`: {run['status']}" + (", stopping after its current step." if run["status"] == "running" else ".")

    outputs = [header, *charts, last_step, alert]
    refresh.click(list_runs, runs, [runs, alert])
    runs.change(show_run, runs, outputs)
    timer.tick(show_run, runs, outputs)
    start.click(start_run, [recipe, data, run_id], [runs, alert])
    cancel.click(cancel_run, runs, alert)
    demo.load(list_runs, runs, [runs, alert])
