"""`rstar eval suites`, and `rstar eval run` on bad input: one line naming the fix, exit code 2, and no run row
written (a run starts only once its grader, data and endpoint are known to work)."""

from __future__ import annotations

import json
import sys

import pytest
from evals_data import shared_data_dir
from sqlalchemy import select
from typer.testing import CliRunner

from rstar.evals.cli import app as eval_app
from rstar.evals.runner import RunStore, plan
from rstar.server.db import EvalRun, open_database

NOTHING_LISTENS = "http://127.0.0.1:9/v1"  # the discard port: connection refused


@pytest.fixture
def database_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'rstar.db'}"


def invoke(*args: str):
    return CliRunner(env={"COLUMNS": "200"}).invoke(eval_app, list(args))


def run_rows(database_url: str) -> list[tuple[str, str]]:
    with open_database(database_url)() as session:
        return [(run.id, run.status) for run in session.scalars(select(EvalRun))]


def one_line_error(result, *fragments: str) -> str:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output  # typer.Exit, no traceback
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rstar eval: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_suites_json_lists_every_benchmark_with_counts_readiness_and_paper_defaults():
    result = invoke("suites", "--data-dir", str(shared_data_dir()), "--json")
    assert result.exit_code == 0, result.output
    entries = {entry["name"]: entry for entry in json.loads(result.output)}
    assert set(entries) == {"aime24", "aime25", "hmmt_feb_2025", "math500", "gpqa_diamond", "ifeval", "bfcl_v3", "gsm8k"}
    assert {name: e["data"]["docs"] for name, e in entries.items()} == {
        "aime24": 30, "aime25": 30, "hmmt_feb_2025": 30, "math500": 500, "gpqa_diamond": 198, "ifeval": 541, "bfcl_v3": 4441, "gsm8k": 1319,
    }  # fmt: skip
    assert all(e["grader"] == {"ready": True, "problems": []} for e in entries.values())
    math500 = entries["math500"]
    assert math500["aliases"] == ["math-500", "math_500"] and entries["hmmt_feb_2025"]["aliases"] == ["hmmt25"]
    assert math500["defaults"] == {"temperature": 0.6, "samples": 16, "max_turns": 30, "max_tokens": 30720, "template": "rstar", "reasoning_max_tokens": None}
    assert (entries["ifeval"]["defaults"]["max_tokens"], entries["ifeval"]["defaults"]["reasoning_max_tokens"]) == (1280, 1280 + 4096)
    assert math500["metric"] == "avg_pass_at_1" and math500["data"]["read_from"] == str(shared_data_dir().resolve())
    assert entries["ifeval"]["defaults"]["template"] == "native" and entries["ifeval"]["metric"] == "prompt_level_strict_acc"
    assert entries["gsm8k"]["defaults"] == {"temperature": 0.0, "samples": 1, "max_turns": 5, "max_tokens": 2048, "template": "rstar", "reasoning_max_tokens": None}


def test_suites_table_and_what_it_says_without_data_or_a_grader(tmp_path, monkeypatch):
    table = invoke("suites", "--data-dir", str(shared_data_dir()))
    assert table.exit_code == 0, table.output
    math_row = next(line for line in table.output.splitlines() if "math500" in line)
    assert all(cell in math_row for cell in ("math-500", "500", "ready", "0.6", "16", "30720", "avg_pass_at_1"))

    default = json.loads(invoke("suites", "--json").output)
    assert {e["name"]: e["data"]["read_from"] for e in default}["math500"] == "HuggingFaceH4/MATH-500"
    assert all(e["data"]["docs"] is None and "read at run time" in e["data"]["problem"] for e in default)

    monkeypatch.setitem(sys.modules, "langdetect", None)  # as if langdetect were not installed
    empty = {e["name"]: e for e in json.loads(invoke("suites", "--data-dir", str(tmp_path), "--json").output)}
    assert "no test.jsonl under" in empty["math500"]["data"]["problem"] and empty["math500"]["data"]["docs"] is None
    assert empty["ifeval"]["grader"]["ready"] is False
    assert empty["ifeval"]["grader"]["problems"] == ["ifeval grading needs langdetect, not installed: run `bash install.sh` (or `pip install -e .` in the environment rstar runs from)"]


def test_an_endpoint_that_does_not_answer_stops_the_run_before_it_is_stored(database_url):
    # The newcomer's command: no --data-dir either. The endpoint is probed before the data is fetched from the
    # hub (unreachable here), so the line names the endpoint, and comes at once.
    result = invoke("run", "--suite", "ifeval", "--endpoint", NOTHING_LISTENS, "--database-url", database_url)
    one_line_error(result, f"no server answers at {NOTHING_LISTENS}", "ConnectError", "start one (`rstar serve`) or fix --endpoint")
    assert run_rows(database_url) == []


def test_a_resume_against_a_dead_endpoint_leaves_the_run_as_it_was(database_url):
    store = RunStore(open_database(database_url))
    run = store.create("paused", "m", NOTHING_LISTENS, ["aime24"], {"benchmarks": plan(["aime24"], {}), "limit": 1, "data_dir": str(shared_data_dir()), "seed": 0})
    store.update(run.id, status="interrupted")
    result = invoke("run", "--resume", "paused", "--database-url", database_url)
    one_line_error(result, "no server answers at")
    assert run_rows(database_url) == [("paused", "interrupted")]


def test_an_unknown_suite_is_one_line_naming_the_known_ones(database_url):
    line = one_line_error(invoke("run", "--suite", "aime24,mmlu", "--database-url", database_url), "unknown benchmark 'mmlu'", "math500", "rstar eval suites")
    assert "Usage:" not in line
    assert run_rows(database_url) == []


def test_an_unknown_template_is_one_line_naming_the_choices(database_url):
    one_line_error(invoke("run", "--suite", "gsm8k", "--template", "chatml", "--database-url", database_url), "--template", "'chatml'", "rstar or native")
    assert run_rows(database_url) == []


def test_template_overrides_every_benchmark_of_the_run():
    planned = plan(["gsm8k", "ifeval"], {"template": "native", "max_tokens": None})
    assert {name: sampling["template"] for name, sampling in planned.items()} == {"gsm8k": "native", "ifeval": "native"}
    assert plan(["gsm8k"], {"template": None})["gsm8k"]["template"] == "rstar"


def test_missing_data_stops_the_run_before_it_is_stored(database_url, tmp_path):
    # In process (no --endpoint): the data is read before the engine starts, so this takes no engine.
    result = invoke("run", "--suite", "math500", "--data-dir", str(tmp_path), "--database-url", database_url)
    one_line_error(result, f"no test.jsonl under {tmp_path}", str(tmp_path / "math500" / "test.jsonl"))
    assert run_rows(database_url) == []


def test_a_missing_grader_package_stops_the_run_before_it_is_stored(database_url, monkeypatch):
    monkeypatch.setitem(sys.modules, "langdetect", None)
    result = invoke("run", "--suite", "aime24,ifeval", "--data-dir", str(shared_data_dir()), "--endpoint", NOTHING_LISTENS, "--database-url", database_url)
    one_line_error(result, "ifeval grading needs langdetect, not installed", "bash install.sh")
    assert run_rows(database_url) == []
