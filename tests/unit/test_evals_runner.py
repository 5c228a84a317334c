"""The runner on a scripted chat client and a real SQLite database: planning, storing each sample once,
resuming, failures and interruption, summaries with standard errors, reports and the `rstar eval` commands."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from evals_data import shared_data_dir
from typer.testing import CliRunner

from rstar.evals import get_benchmark
from rstar.evals.cli import app as eval_app
from rstar.evals.cli import difference, penalties_left_to_model, resume_conflicts
from rstar.evals.client import Completion, FatalRequestError
from rstar.evals.report import FILES, write_run_reports
from rstar.evals.runner import RunStore, execute, pending, plan, sample_seed, select_docs
from rstar.server.db import EvalSample, open_database


class ScriptedClient:
    """Answers from a table keyed by the question text; `fail_after` completions later every call raises."""

    def __init__(self, answers: dict[str, list[str]], fail_after: int | None = None, error: Exception | None = None):
        self.answers = {question: list(replies) for question, replies in answers.items()}
        self.fail_after, self.error = fail_after, error or RuntimeError("connection reset")
        self.calls = 0

    async def complete(self, messages, tools, params) -> Completion:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise self.error
        await asyncio.sleep(0)
        replies = self.answers.get(messages[-1]["content"], ["no idea"])
        text = replies.pop(0) if len(replies) > 1 else replies[0]
        # The trajectory is what gets graded: one finished turn, in the agent loop's shape.
        return Completion(text, [], 20, len(text), 1, 0, "stop", {"turns": [{"text": text, "finish_reason": "stop"}], "tool_calls": [], "stop_reason": "stop"})


@pytest.fixture()
def store(tmp_path):
    return RunStore(open_database(f"sqlite:///{tmp_path / 'rstar.db'}"))


@pytest.fixture(scope="module")
def aime():
    return get_benchmark("aime24").load(shared_data_dir())[:3]


def aime_client(aime, **kwargs) -> ScriptedClient:
    # doc 0: always right; doc 1: right on its first sample only; doc 2: never
    return ScriptedClient(
        {aime[0]["problem"]: [f"\\boxed{{{aime[0]['answer']}}}"], aime[1]["problem"]: [f"\\boxed{{{aime[1]['answer']}}}", "\\boxed{-1}"]}, **kwargs
    )


def new_run(store, samples=2, suite=("aime24",), run_id=None, **overrides):
    config = {"benchmarks": plan(suite, {"samples": samples, **overrides}), "limit": None, "data_dir": None, "seed": 0}
    return store.create(run_id, "scripted", "http://x/v1", list(config["benchmarks"]), config)


def stored_keys(store, run_id):
    with store.sessions() as session:
        return Counter((s.benchmark, s.doc_id, s.sample_index) for s in session.query(EvalSample).filter_by(run_id=run_id))


def test_plan_applies_overrides_over_paper_defaults():
    planned = plan(["hmmt25", "ifeval"], {"samples": 4, "max_tokens": None})
    assert set(planned) == {"hmmt_feb_2025", "ifeval"}  # the short name resolves
    assert planned["hmmt_feb_2025"] == {"temperature": 0.6, "top_p": 1.0, "samples": 4, "max_turns": 30, "max_tokens": 30720, "template": "rstar",
                                        "frequency_penalty": None, "repetition_penalty": None}  # left to the served model
    assert planned["ifeval"]["temperature"] == 0.0 and planned["ifeval"]["samples"] == 4 and planned["ifeval"]["template"] == "native"
    penalised = plan(["gsm8k"], {"frequency_penalty": 0.5, "repetition_penalty": None})["gsm8k"]
    assert (penalised["frequency_penalty"], penalised["repetition_penalty"]) == (0.5, None)


def test_a_run_names_only_the_model_penalties_no_flag_overrode():
    defaults = {"frequency_penalty": 0.1}
    assert penalties_left_to_model(defaults, plan(["gsm8k"], {})) == defaults
    assert penalties_left_to_model(defaults, plan(["gsm8k"], {"frequency_penalty": 0.0})) == {}  # the flag wins
    assert penalties_left_to_model(None, plan(["gsm8k"], {})) == {}  # a server that does not say
    stored_before_the_knob = {"gsm8k": {"temperature": 0.0}}
    assert penalties_left_to_model(defaults, stored_before_the_knob) == {}


def test_limit_takes_the_first_docs_of_each_category():
    docs = [{"id": str(i), "category": c} for i, c in enumerate("aaabbc")]
    assert [d["id"] for d in select_docs(docs, 2)] == ["0", "1", "3", "4", "5"]
    plain = [{"id": str(i)} for i in range(5)]
    assert select_docs(plain, 2) == plain[:2] and select_docs(plain, None) == plain


def test_seeds_are_stable_and_distinct_per_sample():
    seeds = {sample_seed(0, "aime24", str(doc), index) for doc in range(50) for index in range(16)}
    assert len(seeds) == 800 and all(0 <= s < 2**31 for s in seeds)
    assert sample_seed(0, "aime24", "60", 3) == sample_seed(0, "aime24", "60", 3) != sample_seed(1, "aime24", "60", 3)


def test_pending_skips_what_is_stored():
    docs = [{"id": "a"}, {"id": "b"}]
    assert [(d["id"], i) for d, i in pending(docs, 2, {("a", 1), ("b", 0)})] == [("a", 0), ("b", 1)]


def test_a_run_stores_each_sample_once_with_scores_and_counts(store, aime):
    run = new_run(store)
    outcome = asyncio.run(execute(store, run, aime_client(aime), concurrency=4, docs={"aime24": aime}))
    assert (outcome.status, outcome.generated, outcome.skipped, outcome.failed) == ("finished", 6, 0, 0)
    assert set(stored_keys(store, run.id).values()) == {1} and len(stored_keys(store, run.id)) == 6
    summary = store.get(run.id).summary["aime24"]
    assert summary["score"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert summary["stderr"] == pytest.approx(0.5 / 3**0.5)  # sd of (1, .5, 0) over sqrt(3 docs)
    assert summary["metrics"]["pass_at_k"] == pytest.approx(2 / 3)
    assert summary["metrics"]["pass_at"] == {"1": pytest.approx(0.5)}
    assert (summary["samples"], summary["expected_samples"], summary["complete"], summary["refused"]) == (6, 6, True, 0)
    assert summary["mean_prompt_tokens"] == 20 and summary["mean_num_turns"] == 1
    with store.sessions() as session:
        row = session.query(EvalSample).filter_by(run_id=run.id, doc_id=aime[0]["id"], sample_index=1).one()
    assert row.grade["predicted"] == aime[0]["answer"] and row.score == 1.0
    assert row.request["params"]["temperature"] == 0.6 and row.request["params"]["seed"] == sample_seed(0, "aime24", aime[0]["id"], 1)
    assert row.trajectory["turns"] == [{"text": row.response, "finish_reason": "stop"}]  # the one request's trajectory, as the client gave it
    assert row.grade["truncated"] is False and summary["truncation_rate"] == 0.0


def test_a_failed_run_resumes_without_losing_or_double_counting(store, aime):
    run = new_run(store, samples=4)
    first = asyncio.run(execute(store, run, aime_client(aime, fail_after=5), concurrency=2, docs={"aime24": aime}))
    assert (first.status, first.generated, first.failed) == ("failed", 5, 7)
    assert store.get(run.id).status == "failed" and store.get(run.id).summary["aime24"]["complete"] is False
    second = asyncio.run(execute(store, store.get(run.id), aime_client(aime), concurrency=3, docs={"aime24": aime}))
    assert (second.status, second.generated, second.skipped) == ("finished", 7, 5)
    keys = stored_keys(store, run.id)
    assert len(keys) == 12 and set(keys.values()) == {1}
    third = asyncio.run(execute(store, store.get(run.id), aime_client(aime), concurrency=3, docs={"aime24": aime}))
    assert (third.generated, third.skipped) == (0, 12)
    assert store.get(run.id).summary["aime24"]["samples"] == 12


def test_storing_a_sample_twice_is_refused_not_counted(store, aime):
    run = new_run(store, samples=1)
    asyncio.run(execute(store, run, aime_client(aime), concurrency=1, docs={"aime24": aime}))
    grade = store.grades(run.id, "aime24")[0]
    from rstar.evals.client import Sample

    assert store.add(run.id, "aime24", grade, Sample(response="x", request={})) is False
    assert len(stored_keys(store, run.id)) == 3


def test_a_fatal_endpoint_error_stops_the_run(store, aime):
    run = new_run(store)
    client = aime_client(aime, fail_after=2, error=FatalRequestError("401 bad key"))
    with pytest.raises(FatalRequestError):
        asyncio.run(execute(store, run, client, concurrency=1, docs={"aime24": aime}))
    assert store.get(run.id).status == "failed"
    assert client.calls == 3 and len(stored_keys(store, run.id)) == 2
    # with several in flight, the others are cancelled and no request goes out after the refusal
    run = new_run(store)
    client = aime_client(aime, fail_after=2, error=FatalRequestError("401 bad key"))
    with pytest.raises(FatalRequestError):
        asyncio.run(execute(store, run, client, concurrency=3, docs={"aime24": aime}))
    assert client.calls == 3 and store.get(run.id).status == "failed"


def test_an_interrupted_run_keeps_what_it_stored(store, aime):
    run = new_run(store, samples=4)
    release = asyncio.Event()

    class Stalls(ScriptedClient):
        async def complete(self, messages, tools, params):
            if self.calls >= 3:
                await release.wait()  # never set: the run is cancelled here
            return await super().complete(messages, tools, params)

    async def go():
        task = asyncio.create_task(execute(store, run, Stalls({}), concurrency=1, docs={"aime24": aime}))
        while len(stored_keys(store, run.id)) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert store.get(run.id).status == "interrupted" and store.get(run.id).finished_at is None
    assert len(stored_keys(store, run.id)) == 3


def test_reports_are_written_and_hold_no_question_text(store, tmp_path):
    gpqa = get_benchmark("gpqa_diamond").load(shared_data_dir())[:4]
    run = new_run(store, samples=2, suite=("gpqa_diamond", "aime24"))
    client = ScriptedClient({})  # "no idea": every answer wrong
    aime = get_benchmark("aime24").load(shared_data_dir())[:2]
    asyncio.run(execute(store, run, client, concurrency=2, docs={"gpqa_diamond": gpqa, "aime24": aime}))
    run_dir = write_run_reports(store, run.id, tmp_path / "evals")
    assert run_dir == tmp_path / "evals" / run.id and store.get(run.id).run_dir == str(run_dir)
    for name in FILES:
        assert (run_dir / name).stat().st_size > 0
    for name in ("scores.png", "lengths.png", "tool_calls.png"):
        assert (run_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["benchmarks"]["gpqa_diamond"]["score"] == 0.0 and report["benchmarks"]["gpqa_diamond"]["samples"] == 8
    assert report["run"]["config"]["benchmarks"]["aime24"]["samples"] == 2
    markdown = (run_dir / "report.md").read_text()
    assert "| gpqa_diamond | avg_pass_at_1 | 0.0 ± 0.0 | 8/8 | 2 | 0.6 |" in markdown
    texts = [(run_dir / name).read_text() for name in ("report.json", "report.md")]
    leaked = sum(doc["question"][:80] in text for doc in gpqa for text in texts)
    assert leaked == 0  # counted, not shown: a failure must not print the question either


def test_resume_refuses_flags_that_change_the_run():
    config = {"benchmarks": plan(["aime24", "ifeval"], {}), "limit": 5, "data_dir": None, "seed": 0}
    assert resume_conflicts(config, None, {"samples": None, "temperature": None}, {"limit": None, "seed": None}) == []
    assert resume_conflicts(config, ["ifeval", "aime24"], {"samples": None}, {"limit": 5}) == []
    conflicts = resume_conflicts(config, ["aime24"], {"temperature": 0.6}, {"limit": 6})
    assert len(conflicts) == 3  # suite, temperature (ifeval has 0) and limit
    assert any(c.startswith("--temperature 0.6") for c in conflicts) and any(c.startswith("--limit 6") for c in conflicts)
    # A run stored before the penalties existed sampled without them: resuming it with none given, or with the
    # default, is no conflict; a penalty it did not use is.
    for sampling in config["benchmarks"].values():
        del sampling["frequency_penalty"], sampling["repetition_penalty"]
    assert resume_conflicts(config, None, {"frequency_penalty": None, "repetition_penalty": 1.0}, {}) == []
    assert resume_conflicts(config, None, {"frequency_penalty": 0.5}, {}) == [
        "--frequency-penalty 0.5 (run has {'aime24': 0.0, 'ifeval': 0.0})"]


def test_difference_and_its_z_score():
    delta, z = difference({"score": 0.5, "stderr": 0.03}, {"score": 0.6, "stderr": 0.04})
    assert delta == pytest.approx(0.1) and z == pytest.approx(2.0)
    assert difference({"score": 0.5}, {"score": 0.4, "stderr": 0.1}) == (pytest.approx(-0.1), None)


def test_list_show_and_compare_commands(store, aime, tmp_path):
    first = new_run(store, samples=2, run_id="first-run")
    asyncio.run(execute(store, first, aime_client(aime), concurrency=2, docs={"aime24": aime}))
    second = new_run(store, samples=2, run_id="second-run")
    asyncio.run(execute(store, second, ScriptedClient({}), concurrency=2, docs={"aime24": aime}))
    url = str(store.sessions.kw["bind"].url)
    runner = CliRunner(env={"COLUMNS": "200"})

    listed = runner.invoke(eval_app, ["list", "--database-url", url])
    assert listed.exit_code == 0, listed.output
    assert listed.output.index("second-run") < listed.output.index("first-run")  # newest first
    assert "finished" in listed.output and "aime24" in listed.output

    shown = runner.invoke(eval_app, ["show", "first-run", "--database-url", url])
    assert shown.exit_code == 0, shown.output
    assert "50.0 ± 28.9" in shown.output and "6/6" in shown.output and "temperature=0.6" in shown.output

    compared = runner.invoke(eval_app, ["compare", "first-run", "second-run", "--database-url", url])
    assert compared.exit_code == 0, compared.output
    assert "-50.0" in compared.output and "-1.73" in compared.output

    missing = runner.invoke(eval_app, ["run", "--resume", "nope", "--database-url", url])
    assert missing.exit_code == 2 and "no eval run 'nope'" in missing.output
    # an existing --run-id is continued, so flags that change the run are refused there too
    taken = runner.invoke(eval_app, ["run", "--run-id", "first-run", "--temperature", "0", "--database-url", url])
    assert taken.exit_code == 2 and "--temperature 0.0" in taken.output and "first-run was started differently" in taken.output
    changed = runner.invoke(eval_app, ["run", "--resume", "first-run", "--samples", "3", "--database-url", url])
    assert changed.exit_code == 2 and "--samples 3" in changed.output


def test_a_grader_failure_costs_that_sample_only(store, aime):
    broken = [aime[0], {k: v for k, v in aime[1].items() if k != "answer"}, aime[2]]  # grading doc 1 raises
    run = new_run(store, samples=1)
    outcome = asyncio.run(execute(store, run, aime_client(aime), concurrency=2, docs={"aime24": broken}))
    assert (outcome.status, outcome.generated, outcome.failed) == ("failed", 2, 1)
    assert {doc_id for _, doc_id, _ in stored_keys(store, run.id)} == {aime[0]["id"], aime[2]["id"]}


def test_the_scores_chart_names_benchmarks_and_metrics_and_draws_standard_errors():
    from matplotlib.container import ErrorbarContainer

    from rstar.evals.report import scores_figure

    summary = {
        "aime24": {"primary_metric": "avg_pass_at_1", "score": 0.25, "stderr": 0.05},
        "ifeval": {"primary_metric": "prompt_level_strict_acc", "score": 0.6, "stderr": 0.02},
        "bfcl_v3": {"primary_metric": "overall"},  # nothing graded yet
    }
    ax = scores_figure(summary).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["aime24\navg_pass_at_1", "ifeval\nprompt_level_strict_acc", "bfcl_v3\noverall"]
    assert ax.get_ylabel() == "score (%): primary metric ± 1 s.e." and ax.get_ylim() == (0, 100)
    assert [bar.get_height() for bar in ax.patches] == pytest.approx([25, 60, 0])
    (errorbars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    _, _, (segments,) = errorbars.lines
    assert [(low, high) for (_, low), (_, high) in segments.get_segments()] == [pytest.approx((20, 30)), pytest.approx((58, 62)), (0, 0)]
    assert [t.get_text() for t in ax.texts] == ["25.0", "60.0", "-"]
