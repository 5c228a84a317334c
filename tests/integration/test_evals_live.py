"""The eval harness end to end on the real default model: every benchmark over the live API (`rstar eval run
--limit 1`), the in-process path (engine + real sandbox), resume after `kill -9`, and lm-eval driving our
server as its `local-chat-completions` model. Scores of a 135M model are near zero; these tests check the
pipeline and the stored records. Workloads are sized in tokens (MAX_TOKENS per answer; the in-process run keeps
64 so its math answers get past a first complete call) so the file stays short on the slowest CPU while every
component still runs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import DEFAULT_MODEL_NAME
from typer.testing import CliRunner

from rstar.evals import get_benchmark
from rstar.evals.answers import answer_view
from rstar.evals.bfcl import CATEGORIES
from rstar.evals.cli import app as eval_app
from rstar.evals.report import FILES
from rstar.evals.runner import RunStore, execute, plan
from rstar.server.model_store import model_sampling_defaults
from rstar.server.db import open_database

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "unit"))
from evals_data import shared_data_dir  # noqa: E402

SUITE = "aime24,aime25,hmmt25,gpqa_diamond,ifeval,bfcl_v3,gsm8k"
MAX_TOKENS = 24
SMALL = ["--samples", "1", "--max-tokens", str(MAX_TOKENS), "--max-turns", "2"]


def sample_rows(db: Path, run_id: str) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return connection.execute(
            "select benchmark, doc_id, sample_index, score, request, response, trajectory, completion_tokens, num_turns from eval_samples where run_id = ?",
            (run_id,),
        ).fetchall()


def test_every_benchmark_runs_end_to_end_over_the_api(live_server, tmp_path):
    db = tmp_path / "evals.db"
    env = {"RSTAR_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "200"}
    common = ["--endpoint", f"{live_server.base_url}/v1", "--limit", "1", "--data-dir", str(shared_data_dir()), "--database-url", f"sqlite:///{db}"]
    # A budget the server's window cannot hold is refused before anything is stored, naming both numbers.
    too_long = CliRunner(env=env).invoke(eval_app, ["run", "--suite", "aime24", "--max-tokens", "8192", "--run-id", "too-long", *common])
    assert too_long.exit_code == 2 and "does not fit the server's context window of 8192 tokens: aime24 (max_tokens 8192 + longest prompt" in too_long.output
    assert not sample_rows(db, "too-long") and "too-long" not in CliRunner(env=env).invoke(eval_app, ["list", "--database-url", f"sqlite:///{db}"]).output

    args = ["run", "--suite", SUITE, *SMALL, "--concurrency", "8", "--run-id", "e2e", *common]
    result = CliRunner(env=env).invoke(eval_app, args)
    assert result.exit_code == 0, result.output

    rows = sample_rows(db, "e2e")
    keys = Counter((benchmark, doc_id, index) for benchmark, doc_id, index, *_ in rows)
    assert set(keys.values()) == {1}
    per_benchmark = Counter(benchmark for benchmark, *_ in keys)
    # --limit 1 takes one doc of each of BFCL's 17 categories
    assert per_benchmark == {"aime24": 1, "aime25": 1, "hmmt_feb_2025": 1, "gpqa_diamond": 1, "ifeval": 1, "bfcl_v3": 17, "gsm8k": 1}
    refusals = Counter()
    for benchmark, doc_id, index, score, request, response, trajectory, tokens, turns in rows:
        request, response, trajectory = json.loads(request), json.loads(response), json.loads(trajectory)
        assert 0.0 <= score <= 1.0 and index == 0
        assert request["messages"] and request["params"]["max_tokens"] == MAX_TOKENS
        refused = [t for t in trajectory.get("requests", [trajectory]) if "error" in t]  # a multi-turn request grown past the window
        assert "turns" in trajectory and "tool_calls" in trajectory
        assert turns >= 1 or refused
        refusals[benchmark] += bool(refused)
        if benchmark != "bfcl_v3":  # text answers: the model wrote something, within the budget
            assert isinstance(response, str) and 0 < tokens <= MAX_TOKENS
        else:
            assert isinstance(response, list)

    with open_database(f"sqlite:///{db}")() as session:
        from rstar.server.db import EvalRun

        run = session.get(EvalRun, "e2e")
    assert run.status == "finished" and run.endpoint.startswith(live_server.base_url) and run.model == DEFAULT_MODEL_NAME
    # No penalty flag given: the run sampled with the served model's recommended ones, and says which.
    assert run.config["model_sampling_defaults"] == model_sampling_defaults(DEFAULT_MODEL_NAME) != {}
    assert "penalties no flag sets are the model's: frequency_penalty=" in result.output
    assert all(entry["complete"] and "score" in entry for entry in run.summary.values())
    assert {name: entry["refused"] for name, entry in run.summary.items() if entry["refused"]} == {b: n for b, n in refusals.items() if n}
    assert run.summary["bfcl_v3"]["metrics"]["categories"].keys() == set(CATEGORIES)
    assert Path(run.run_dir) == tmp_path / "data" / "evals" / "e2e"
    assert all((Path(run.run_dir) / name).stat().st_size > 0 for name in FILES)
    assert "| bfcl_v3 | overall |" in (Path(run.run_dir) / "report.md").read_text()


def test_in_process_run_uses_the_rstar_template_and_the_real_sandbox(engine, loop_thread, tmp_path):
    from rstar.evals.client import InProcessChatClient
    from rstar.sandbox.clients import LocalClient
    from rstar.sandbox.settings import SandboxSettings
    from rstar.server.builtin_tools import SandboxExecutor
    from rstar.evals.answers import answer_view
    from rstar.evals.client import benchmark_template
    from rstar.evals.registry import NATIVE_TEMPLATE

    sandbox = loop_thread.run(LocalClient(SandboxSettings()).start())
    try:
        store = RunStore(open_database(f"sqlite:///{tmp_path / 'evals.db'}"))
        config = {"benchmarks": plan(["aime24", "ifeval"], {"samples": 2, "max_tokens": 64, "max_turns": 3}), "limit": 2, "data_dir": str(shared_data_dir()), "seed": 0}
        run = store.create(None, engine.model_name, "", list(config["benchmarks"]), config)
        client = InProcessChatClient(engine, SandboxExecutor(sandbox), loop=loop_thread.loop)
        # Driven from this (main) thread, as the CLI does: grading needs it; the engine stays on its loop.
        outcome = asyncio.run(execute(store, run, client, concurrency=4))
    finally:
        loop_thread.run(sandbox.close())
    assert (outcome.status, outcome.generated) == ("finished", 8)
    tokenizer = engine.tokenizer
    rows = sample_rows(tmp_path / "evals.db", run.id)
    # the model's own (the default model ships rStar's), without the math answer instruction
    native = benchmark_template(tokenizer, engine.model_name, NATIVE_TEMPLATE)
    for benchmark, _, _, _, request, response, trajectory, tokens, turns in rows:
        completion = json.loads(trajectory)  # the agent loop's own trajectory, token ids included
        prompt = tokenizer.decode(completion["prompt_ids"])
        assert ("python_code_with_standard_io" in prompt) == (benchmark == "aime24")  # only math gets the tool
        if benchmark == "aime24":
            assert "You must put your answer inside <answer> </answer> tags" in prompt
        else:  # IFEval: its own prompt through the model's own template, no answer instruction
            assert completion["prompt_ids"] == native.encode(json.loads(request)["messages"])
            assert "You must put your answer" not in prompt and prompt.endswith("<|im_start|>assistant\n<reason>")
        assert 0 < tokens <= 64 and turns == len(completion["turns"])
        assert json.loads(response) == answer_view(completion).answer_text  # what the grader read


def test_a_killed_run_resumes_without_losing_or_double_counting(live_server, tmp_path):
    db = tmp_path / "evals.db"
    command = [sys.executable, "-m", "rstar.cli", "eval", "run", "--suite", "ifeval", "--endpoint", f"{live_server.base_url}/v1", "--limit", "12"]
    command += [*SMALL, "--concurrency", "2", "--data-dir", str(shared_data_dir()), "--database-url", f"sqlite:///{db}"]
    env = {**os.environ, "RSTAR_DATA_DIR": str(tmp_path / "data")}
    first = subprocess.Popen([*command, "--run-id", "killed"], cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    stored = 0
    while stored < 3:
        assert first.poll() is None, first.stderr.read().decode()
        assert time.time() < deadline, "no samples stored in 120 s"
        time.sleep(0.2)
        try:
            stored = len(sample_rows(db, "killed"))
        except sqlite3.OperationalError:  # the database is not created and migrated yet
            stored = 0
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    first.stderr.close()
    before = Counter((doc_id, index) for _, doc_id, index, *_ in sample_rows(db, "killed"))
    assert 3 <= sum(before.values()) < 12, "the run finished before it was killed"

    # started again: the same command (its --run-id exists) continues the run
    second = subprocess.run([*command, "--run-id", "killed"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    after = Counter((doc_id, index) for _, doc_id, index, *_ in sample_rows(db, "killed"))
    assert len(after) == 12 and set(after.values()) == {1}
    assert all(before[key] == 1 for key in before)  # nothing stored before the kill was lost or redone
    assert f"stored {12 - sum(before.values())} new samples ({sum(before.values())} already stored, 0 failed)" in " ".join(second.stderr.split())
    with sqlite3.connect(db) as connection:
        status, summary = connection.execute("select status, summary from eval_runs where id = 'killed'").fetchone()
    assert status == "finished" and json.loads(summary)["ifeval"]["samples"] == 12


def lm_eval_task(tmp_path: Path, data_dir: Path) -> Path:
    """lm-eval's own ifeval task, reading our offline copy instead of the Hugging Face hub."""
    import lm_eval

    include = tmp_path / "tasks"
    include.mkdir()
    (include / "ifeval_offline.yaml").write_text(
        f"include: {Path(lm_eval.__file__).parent / 'tasks' / 'ifeval' / 'ifeval.yaml'}\n"
        "task: ifeval_offline\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    train: {data_dir / 'ifeval' / 'input_data.jsonl'}\n"
        f"generation_kwargs:\n  until: []\n  do_sample: false\n  temperature: 0.0\n  max_gen_toks: {MAX_TOKENS}\n"
    )
    return include


def test_lm_eval_scores_our_server_and_agrees_with_our_ifeval_grader(live_server, tmp_path):
    include = lm_eval_task(tmp_path, shared_data_dir())
    model_args = f"model={DEFAULT_MODEL_NAME},base_url={live_server.base_url}/v1/chat/completions,num_concurrent=2,max_retries=1,tokenized_requests=False"
    command = [sys.executable, "-m", "lm_eval", "--model", "local-chat-completions", "--model_args", model_args, "--tasks", "ifeval_offline"]
    command += ["--include_path", str(include), "--limit", "4", "--apply_chat_template", "--log_samples", "--output_path", str(tmp_path / "out")]
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    results_file = next((tmp_path / "out").rglob("results_*.json"))
    theirs = json.loads(results_file.read_text())["results"]["ifeval_offline"]
    samples = [json.loads(line) for line in next((tmp_path / "out").rglob("samples_ifeval_offline_*.jsonl")).read_text().splitlines()]
    assert len(samples) == 4 and all(s["resps"][0][0] for s in samples)  # our server answered every prompt

    bench = get_benchmark("ifeval")
    docs = {d["key"]: d for d in bench.load(shared_data_dir())}
    grades = [bench.grade(docs[s["doc"]["key"]], s["resps"][0][0], 0) for s in samples]
    ours = bench.aggregate(grades)
    for metric in ("prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc", "inst_level_loose_acc"):
        assert ours[metric] == pytest.approx(theirs[f"{metric},none"]), metric
