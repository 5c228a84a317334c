"""`rstar eval`: run a benchmark suite, list, show and compare runs.

    rstar eval run --suite aime24,gpqa_diamond --endpoint http://127.0.0.1:8000/v1 --limit 5
    rstar eval run --resume RUN_ID            # continue an interrupted run (its stored config applies)
    rstar eval run --run-id nightly ...       # the same command again continues run "nightly" where it stopped
    rstar eval list | show RUN | compare RUN_A RUN_B
    rstar eval suites [--data-dir DIR] [--json]   # what can run here, with each suite's paper defaults

Before a run row is written, `run` checks what would make every sample fail, cheapest first: an unknown suite, a
grader whose packages are missing, an endpoint that does not answer, data that cannot be read (in process: before
the engine starts). Each stops it with one line
naming the fix (exit code 2) and leaves the database as it was.

Without --endpoint the model runs in this process (vLLM engine + sandbox pool), as `rstar serve` would.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from rstar.config import load_settings
from rstar.evals.registry import NATIVE_TEMPLATE, RSTAR_TEMPLATE, SAMPLING_DEFAULTS

app = typer.Typer(no_args_is_help=True, help="Benchmarks: AIME24/25, HMMT25, MATH-500, GPQA-Diamond, IFEval, BFCL v3.")
console = Console(stderr=True)


def _out() -> Console:
    # Made per command, so the width follows the terminal (or COLUMNS) at the time.
    return Console()

PAPER_SUITE = "aime24,aime25,hmmt25,math500,gpqa_diamond,ifeval,bfcl_v3"


class RichProgress:
    """One bar per benchmark: done/total, running mean score, elapsed and ETA."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.tasks: dict[str, Any] = {}
        self.scores: dict[str, list[float]] = {}

    def add_benchmark(self, benchmark: str, total: int, completed: int, score_sum: float) -> None:
        self.scores[benchmark] = [score_sum, completed]
        self.tasks[benchmark] = self.progress.add_task(benchmark, total=total, completed=completed, score=self._score(benchmark))

    def advance(self, benchmark: str, score: float) -> None:
        self.scores[benchmark][0] += score
        self.scores[benchmark][1] += 1
        self.progress.update(self.tasks[benchmark], advance=1, score=self._score(benchmark))

    def _score(self, benchmark: str) -> str:
        total, count = self.scores[benchmark]
        return f"{100 * total / count:5.1f}%" if count else "  -  "


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("score {task.fields[score]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )


def resume_conflicts(config: dict, suite: list[str] | None, overrides: dict[str, Any], run_options: dict[str, Any]) -> list[str]:
    """Flags given to `--resume` that contradict the stored run (a resume must repeat what was asked)."""
    conflicts = []
    if suite is not None and sorted(suite) != sorted(config["benchmarks"]):
        conflicts.append(f"--suite {','.join(suite)} (run has {','.join(config['benchmarks'])})")
    for key, value in overrides.items():
        stored = {name: {**SAMPLING_DEFAULTS, **sampling}[key] for name, sampling in config["benchmarks"].items()}
        if value is not None and any(v != value for v in stored.values()):
            conflicts.append(f"--{key.replace('_', '-')} {value} (run has {stored})")
    for key, value in run_options.items():
        if value is not None and config.get(key) != value:
            conflicts.append(f"--{key.replace('_', '-')} {value} (run has {config.get(key)})")
    return conflicts


def penalties_left_to_model(sampling_defaults: dict[str, float] | None, benchmarks: dict[str, dict]) -> dict[str, float]:
    """The model's default penalties that some benchmark of the run samples with: those it planned as None (no
    flag set them). A run stored before the penalties existed has no such key and sampled without them."""
    return {key: value for key, value in (sampling_defaults or {}).items() if any(key in planned and planned[key] is None for planned in benchmarks.values())}


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]rstar eval:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _suite(text: str) -> list[str]:
    from rstar.evals import get_benchmark

    try:
        return [get_benchmark(name.strip()).name for name in text.split(",") if name.strip()]
    except KeyError as exc:
        raise _fail(f"--suite: {exc.args[0]} (`rstar eval suites` lists them with their aliases)") from None


def check_graders(benchmarks: list[str]) -> None:
    """Stop before anything is stored when a grader's packages are missing (every sample would fail)."""
    from rstar.evals import get_benchmark

    if problems := [problem for name in benchmarks for problem in get_benchmark(name).grader_problems()]:
        raise _fail("; ".join(problems))


def load_docs(config: dict) -> dict[str, list]:
    """Every benchmark's docs from the run's data dir, before its row is written (the runner gets them loaded)."""
    from rstar.evals import DataUnavailable, get_benchmark

    data_dir = Path(config["data_dir"]) if config.get("data_dir") else None
    docs = {}
    for name in config["benchmarks"]:
        try:
            docs[name] = get_benchmark(name).load(data_dir)
        except DataUnavailable as exc:
            raise _fail(str(exc)) from None
    return docs


PROBE_TIMEOUT_S = 30.0


async def probe_endpoint(client, endpoint: str) -> list[dict]:
    """The endpoint's model list, or one line saying why it cannot serve the run (nothing listening, no
    OpenAI API at that URL, a key it wants)."""
    import httpx

    try:
        return await asyncio.wait_for(client.models(), PROBE_TIMEOUT_S)
    except httpx.HTTPStatusError as exc:
        status = exc.response.status_code
        fix = "pass --api-key (or set RSTAR_API_KEY)" if status in (401, 403) else "give --endpoint the server's /v1 URL"
        raise _fail(f"{endpoint} answered HTTP {status} to GET /models: {fix}") from None
    except (httpx.HTTPError, asyncio.TimeoutError) as exc:
        reason = f"no answer within {PROBE_TIMEOUT_S:.0f} s" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
        raise _fail(f"no server answers at {endpoint} ({reason}): start one (`rstar serve`) or fix --endpoint") from None
    except (ValueError, KeyError, TypeError):
        raise _fail(f"{endpoint} answered GET /models, but not with an OpenAI model list: give --endpoint an OpenAI-compatible /v1 URL") from None


@app.command("run")
def run_command(
    suite: Annotated[Optional[str], typer.Option(help=f"Comma-separated benchmarks. [default: {PAPER_SUITE}]")] = None,
    endpoint: Annotated[Optional[str], typer.Option(help="An OpenAI-compatible server (http://host:port/v1); none: run the model in this process.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="With --endpoint: the model name to send (default: the server's first); else the model to load. [env: RSTAR_MODEL]")] = None,
    api_key: Annotated[Optional[str], typer.Option(help="Bearer token for --endpoint. [env: RSTAR_API_KEY]")] = None,
    samples: Annotated[Optional[int], typer.Option(min=1, help="Samples per question (k). [default: per benchmark, 16 for math/GPQA]")] = None,
    temperature: Annotated[Optional[float], typer.Option(min=0.0, help="[default: 0.6 math/GPQA, 0 IFEval/BFCL]")] = None,
    top_p: Annotated[Optional[float], typer.Option(min=0.0, max=1.0, help="[default: 1.0]")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, help="Tokens per answer, tool output included. [default: 30720 math/GPQA]")] = None,
    frequency_penalty: Annotated[Optional[float], typer.Option(min=-2.0, max=2.0, help="OpenAI's: lowers a token's logit by this much per time the answer has already written it. [default: the served model's, see /v1/models; 0 for all but the embedded default model]")] = None,
    repetition_penalty: Annotated[Optional[float], typer.Option(min=0.01, max=2.0, help="vLLM's: divides a positive logit (multiplies a negative one) of any token already in the prompt or answer; 1 = off. [default: the served model's; 1 for every embedded model]")] = None,
    max_turns: Annotated[Optional[int], typer.Option(min=1, help="Assistant turns per answer (BFCL multi-turn: steps per user turn). [default: 30]")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Samples in flight at once.")] = 16,
    limit: Annotated[Optional[int], typer.Option(min=1, help="Only the first N questions of each benchmark (of each category for BFCL).")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="Local benchmark data laid out like shared/data/; none: the Hugging Face sources.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Base of the per-sample seeds. [default: 0]")] = None,
    tool_timeout: Annotated[Optional[float], typer.Option(help="Seconds one Python execution may run (server's default if unset).")] = None,
    template: Annotated[
        Optional[str], typer.Option(help="rstar (rStar's system prompt and answer instruction, the Python tool offered) or native (the model's own template, no tool), for a base model on a math suite. [default: per benchmark]")
    ] = None,
    answer_extraction: Annotated[
        Optional[str], typer.Option(help="How math answers are read: paper (\\boxed{} inside <answer>) or released (the released reward: whole response, tool output included, with its fallbacks). [default: paper]")
    ] = None,
    run_id: Annotated[Optional[str], typer.Option(help="Id for the run, up to 32 characters (default: random); an existing run with this id is continued, as with --resume.")] = None,
    resume: Annotated[Optional[str], typer.Option(help="Continue this run: only missing samples are generated.")] = None,
    database_url: Annotated[Optional[str], typer.Option(help="[env: RSTAR_DATABASE_URL]")] = None,
) -> None:
    """Generate, grade and store every sample; write reports to <data dir>/evals/<run id>/."""
    from rstar.evals.answers import PAPER_EXTRACTION
    from rstar.evals.runner import RunStore, plan
    from rstar.server.db import open_database

    settings = load_settings(model=model if endpoint is None else None, api_key=api_key, database_url=database_url)
    store = RunStore(open_database(settings.resolved_database_url))
    overrides = {
        "samples": samples, "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "max_turns": max_turns, "template": template,
        "frequency_penalty": frequency_penalty, "repetition_penalty": repetition_penalty,
    }
    if template is not None and template not in (RSTAR_TEMPLATE, NATIVE_TEMPLATE):
        raise _fail(f"--template: {template!r} is not a template choice; use {RSTAR_TEMPLATE} or {NATIVE_TEMPLATE}")
    from rstar.evals.answers import extraction_error

    if answer_extraction is not None and (problem := extraction_error(answer_extraction)):
        raise _fail(f"--answer-extraction: {problem}")
    run_options = {
        "limit": limit,
        "data_dir": str(data_dir.resolve()) if data_dir else None,
        "seed": seed,
        "tool_timeout": tool_timeout,
        "answer_extraction": answer_extraction,
    }
    if run_id and not resume and store.get(run_id) is not None:
        # The same command started again (after a crash or kill): continue the run it started.
        resume = run_id
    if resume:
        run = store.get(resume)
        if run is None:
            raise _fail(f"no eval run {resume!r} in {settings.resolved_database_url}")
        conflicts = resume_conflicts(run.config, _suite(suite) if suite else None, overrides, run_options)
        if model and model != run.model:
            conflicts.append(f"--model {model} (run has {run.model})")
        if conflicts:
            raise _fail(f"run {resume} was started differently; start a new run to change: {'; '.join(conflicts)}")
        endpoint = endpoint or run.endpoint or None
        config, model_name = run.config, run.model
    else:
        if run_id and len(run_id) > 32:
            raise _fail(f"--run-id is at most 32 characters: {run_id!r}")
        config = {"benchmarks": plan(_suite(suite or PAPER_SUITE), overrides), **run_options, "seed": seed or 0, "answer_extraction": answer_extraction or PAPER_EXTRACTION}
        model_name = model
    check_graders(list(config["benchmarks"]))
    asyncio.run(_run(store, settings, resume or run_id, config, model_name, endpoint, concurrency, resuming=bool(resume)))


async def _run(store, settings, run_id: str | None, config: dict, model: str | None, endpoint: str | None, concurrency: int, resuming: bool) -> None:
    from rstar.evals.client import FatalRequestError, HttpChatClient
    from rstar.evals.report import write_run_reports
    from rstar.evals.budget import longest_prompt, measure_with_server, measure_with_tokenizer, model_window_limit, refusal, with_reasoning_budgets
    from rstar.evals.registry import get_benchmark
    from rstar.evals.runner import execute, select_docs

    def longest_prompts(docs: dict[str, list]) -> dict:
        return {name: longest_prompt(select_docs(docs[name], config.get("limit")), get_benchmark(name).build_prompt) for name in docs}

    async def go(client, model_name: str, docs: dict[str, list], sampling_defaults: dict[str, float] | None):
        """`sampling_defaults`: the penalties the model samples with where no flag sets one (None: the server does not say)."""
        if not resuming:
            config["model_sampling_defaults"] = sampling_defaults
        if left := penalties_left_to_model(sampling_defaults, config["benchmarks"]):
            console.print(f"penalties no flag sets are the model's: {', '.join(f'{k}={v:g}' for k, v in left.items())}", highlight=False)
        run = store.get(run_id) if resuming else store.create(run_id, model_name, endpoint or "", list(config["benchmarks"]), config)
        if resuming:
            store.update(run.id, status="running")
        console.print(f"eval run [bold]{run.id}[/bold] ({model_name}); resume with: rstar eval run --resume {run.id}", highlight=False)
        try:
            with _progress() as bars:
                outcome = await execute(store, run, client, concurrency, RichProgress(bars), docs)
        except FatalRequestError as exc:
            raise _fail(str(exc)) from None
        finally:
            run_dir = write_run_reports(store, run.id, settings.data_dir / "evals")
        _print_summary(store.get(run.id))
        console.print(f"stored {outcome.generated} new samples ({outcome.skipped} already stored, {outcome.failed} failed); reports in {run_dir}", highlight=False)
        if outcome.failed:
            raise typer.Exit(1)

    if endpoint:
        client = HttpChatClient(endpoint, settings.api_key or os.environ.get("OPENAI_API_KEY"))
        try:
            models = await probe_endpoint(client, endpoint)
            model = model or models[0]["id"]
            if not client.rstar_server and (needs_tool := [name for name, b in config["benchmarks"].items() if b["template"] == RSTAR_TEMPLATE]):
                raise _fail(
                    f"{', '.join(needs_tool)} run with the rStar template and its built-in Python tool, which only an rstar server executes; "
                    f"{endpoint} is not one (its /v1/models does not say owned_by: rstar). Serve the model with `rstar serve`, or run only native suites"
                )
            docs = load_docs(config)  # after the endpoint: it answers in seconds, a hub may not
            window = next((m.get("max_model_len") for m in models if m["id"] == model), None)
            budgets = with_reasoning_budgets(config, await measure_with_server(client, config["benchmarks"], longest_prompts(docs), model))
            if window is None:
                console.print(
                    f"the server does not report its context window (max_model_len in /v1/models), so the token budget is not checked; "
                    f"requests over its window are stored as refused samples scoring 0",
                    highlight=False,
                )
            elif problem := refusal(budgets, window, "the server's context window", "serve with a larger window (rstar serve --max-model-len N)"):
                raise _fail(problem)
            await go(client, model, docs, next((m.get("sampling_defaults") for m in models if m["id"] == model), None))
        finally:
            await client.close()
        return

    from rstar.evals.client import InProcessChatClient
    from rstar.sandbox.clients import connect
    from rstar.server.builtin_tools import SandboxExecutor
    from rstar.server.engine import VllmEngine
    from rstar.server.model_store import model_sampling_defaults, resolve_model

    from transformers import AutoTokenizer

    docs = load_docs(config)  # before the engine's minute of start-up
    resolved = resolve_model(settings.model, settings.models_dir)
    name = model or resolved.name
    try:
        budgets = with_reasoning_budgets(config, measure_with_tokenizer(AutoTokenizer.from_pretrained(resolved.path), name, config["benchmarks"], longest_prompts(docs)))
    except ValueError as exc:  # the native template on a model without a template of its own
        raise _fail(f"{exc}; IFEval and BFCL are scored with the model's own template, so run them on a model that has one") from None
    supported = model_window_limit(resolved.path) or settings.engine.max_model_len
    if problem := refusal(budgets, supported, f"{name}'s longest supported context (max_position_embeddings)", "use a model with a longer context"):
        raise _fail(problem)
    # A window that fits the run's largest budget: the configured one when it is larger (and the model supports it).
    window = max(min(settings.engine.max_model_len, supported), *(b.needed for b in budgets))
    console.print(f"starting the engine on {resolved.path} with a {window}-token window (on CPU about a minute, a first compiled start several)", highlight=False)
    engine = await VllmEngine.start(resolved.path, settings.engine.model_copy(update={"max_model_len": window}), served_model_name=name, cache_dir=settings.cache_dir)
    try:
        async with connect(settings.sandbox) as sandbox:
            await go(InProcessChatClient(engine, SandboxExecutor(sandbox)), name, docs, model_sampling_defaults(name))
    finally:
        await engine.shutdown()


def _summary_table(run) -> Table:
    from rstar.evals.report import score_text

    table = Table(title=f"{run.id}  {run.model}  [{run.status}]")
    for column in ("benchmark", "metric", "score ± s.e. (%)", "samples", "tokens", "turns", "tool calls"):
        table.add_column(column, justify="left" if column in ("benchmark", "metric") else "right", overflow="fold")
    for name, entry in (run.summary or {}).items():
        means = [f"{entry[key]:.1f}" if key in entry else "-" for key in ("mean_completion_tokens", "mean_num_turns", "mean_num_tool_calls")]
        table.add_row(name, entry["primary_metric"], score_text(entry), f"{entry['samples']}/{entry['expected_samples']}", *means)
    return table


def _print_summary(run) -> None:
    _out().print(_summary_table(run))


def _store(database_url: str | None):
    from rstar.evals.runner import RunStore
    from rstar.server.db import open_database

    return RunStore(open_database(load_settings(database_url=database_url).resolved_database_url))


DatabaseOpt = Annotated[Optional[str], typer.Option(help="[env: RSTAR_DATABASE_URL]")]


def suite_entries(data_dir: Path | None) -> list[dict[str, Any]]:
    """What `rstar eval suites` shows for each registered benchmark: names, where its data is read from and how
    many docs are there (counted only in a local copy: the default sources are fetched at run time), whether
    this install can grade it, and its paper defaults."""
    from rstar.evals import REGISTRY, DataUnavailable
    from rstar.evals.registry import ALIASES

    entries = []
    for name, bench in REGISTRY.items():
        grader = bench.grader_problems()
        data: dict[str, Any] = {"read_from": str(data_dir) if data_dir else bench.source, "docs": None, "problem": None}
        if data_dir is None:
            data["problem"] = "default source, read at run time (not checked here; --data-dir DIR counts a local copy)"
        elif grader:
            data["problem"] = "not read: its grader's packages are missing (loading needs them too)"
        else:
            try:
                data["docs"] = len(bench.load(data_dir))
            except DataUnavailable as exc:
                data["problem"] = str(exc)
        entries.append(
            {
                "name": name,
                "aliases": sorted(alias for alias, target in ALIASES.items() if target == name),
                "data": data,
                "grader": {"ready": not grader, "problems": grader},
                "defaults": asdict(bench.sampling),
                "metric": bench.primary_metric,
            }
        )
    return entries


@app.command("suites")
def suites_command(
    data_dir: Annotated[Optional[Path], typer.Option(help="Count the docs of a local copy laid out like shared/data/.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list on stdout, for scripts.")] = False,
) -> None:
    """The benchmarks `rstar eval run --suite` takes: data, grader readiness here, and the paper's defaults."""
    entries = suite_entries(data_dir.resolve() if data_dir else None)
    if as_json:
        typer.echo(json.dumps(entries, indent=2))
        return
    table = Table(title="rstar eval suites" + (f" (data: {data_dir})" if data_dir else " (data: default sources)"))
    for column in ("suite", "aliases", "docs", "data", "grader", "temp", "samples", "turns", "max tokens", "template", "metric"):
        table.add_column(column, overflow="fold", justify="right" if column in ("docs", "temp", "samples", "turns", "max tokens") else "left")
    for entry in entries:
        data, grader, defaults = entry["data"], entry["grader"], entry["defaults"]
        table.add_row(
            entry["name"],
            ", ".join(entry["aliases"]) or "-",
            "-" if data["docs"] is None else str(data["docs"]),
            data["read_from"] if data["docs"] is not None else f"{data['read_from']}: {data['problem']}",
            "[green]ready[/green]" if grader["ready"] else f"[red]missing[/red]: {'; '.join(grader['problems'])}",
            f"{defaults['temperature']:g}",
            str(defaults["samples"]),
            str(defaults["max_turns"]),
            str(defaults["max_tokens"]) + (f" ({defaults['reasoning_max_tokens']} if the template opens reasoning)" if defaults["reasoning_max_tokens"] else ""),
            defaults["template"],
            entry["metric"],
        )
    _out().print(table)


@app.command("list")
def list_command(database_url: DatabaseOpt = None) -> None:
    """Every run, newest first."""
    table = Table()
    for column in ("run", "created", "status", "model", "suite", "samples"):
        table.add_column(column, overflow="fold")
    for run, count in _store(database_url).runs():
        table.add_row(run.id, f"{run.created_at:%Y-%m-%d %H:%M}", run.status, run.model, ",".join(run.suite), str(count))
    _out().print(table)


@app.command("show")
def show_command(run_id: str, database_url: DatabaseOpt = None) -> None:
    """A run's scores, sampling and report directory."""
    run = _store(database_url).get(run_id)
    if run is None:
        raise _fail(f"no eval run {run_id!r}")
    _print_summary(run)
    for name, sampling in run.config["benchmarks"].items():
        _out().print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in sampling.items()), highlight=False)
    _out().print(f"endpoint: {run.endpoint or 'in-process'}; limit: {run.config.get('limit')}; reports: {run.run_dir or '-'}", highlight=False)


def difference(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float | None]:
    """B - A and its z score (difference over the combined standard error; None without standard errors)."""
    delta = b["score"] - a["score"]
    if a.get("stderr") is None or b.get("stderr") is None:
        return delta, None
    combined = math.hypot(a["stderr"], b["stderr"])
    return delta, (delta / combined if combined else None)


@app.command("compare")
def compare_command(run_a: str, run_b: str, database_url: DatabaseOpt = None) -> None:
    """Scores of two runs side by side: B - A, and its z score (|z| > 2: unlikely to be noise)."""
    from rstar.evals.report import score_text

    store = _store(database_url)
    runs = [store.get(run_a), store.get(run_b)]
    for run_id, run in zip((run_a, run_b), runs):
        if run is None:
            raise _fail(f"no eval run {run_id!r}")
    table = Table(title=f"A = {run_a} ({runs[0].model}), B = {run_b} ({runs[1].model})")
    for column in ("benchmark", "metric", "A (%)", "B (%)", "B - A", "z"):
        table.add_column(column, justify="left" if column in ("benchmark", "metric") else "right", overflow="fold")
    for name in dict.fromkeys([*runs[0].summary, *runs[1].summary]):
        a, b = runs[0].summary.get(name, {}), runs[1].summary.get(name, {})
        if "score" in a and "score" in b:
            delta, z = difference(a, b)
            cells = [f"{100 * delta:+.1f}", f"{z:+.2f}" if z is not None else "-"]
        else:
            cells = ["-", "-"]
        table.add_row(name, (a or b).get("primary_metric", "-"), score_text(a), score_text(b), *cells)
    _out().print(table)
