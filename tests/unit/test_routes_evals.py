"""The read-only eval endpoints, over a run the eval runner wrote (tests/eval_run.py): mounted on a bare app with
the API's error handlers, and through `build_app` to check the API key guards them and that the app reaches
its database through one engine."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from rstar.config import load_settings
from rstar.evals.report import FILES
from rstar.server.db import close_database, open_database
from tests.eval_run import eval_routes_app, write_eval_run
from tests.scripted_engine import ScriptedEngine
from tests.scripted_sandbox import ScriptedSandbox


@pytest.fixture(scope="module")
def served_run(tmp_path_factory, default_tokenizer):
    """(test client, what the runner wrote): one run for the module; the tests only read it."""
    root = tmp_path_factory.mktemp("evals")
    sessions = open_database(f"sqlite:///{root / 'rstar.db'}")
    written = write_eval_run(sessions, root / "runs", default_tokenizer)
    yield TestClient(eval_routes_app(sessions)), written
    close_database(sessions)


def sample_ids(client: TestClient, run_id: str) -> dict[str, int]:
    """doc id -> sample id, as the list endpoint gives them."""
    return {s["doc_id"]: s["id"] for s in client.get(f"/v1/evals/runs/{run_id}/samples").json()["data"]}


def test_runs_list_and_detail(served_run):
    client, written = served_run
    runs = client.get("/v1/evals/runs").json()
    assert runs["total"] == 1 and runs["data"][0]["id"] == written.run_id and runs["data"][0]["status"] == "finished"
    assert runs["data"][0]["finished_at"] and runs["data"][0]["suite"] == ["aime24"]
    run = client.get(f"/v1/evals/runs/{written.run_id}").json()
    summary = run["summary"]["aime24"]
    assert (summary["primary_metric"], summary["score"], summary["samples"], summary["complete"]) == ("avg_pass_at_1", 0.5, 2, True)
    assert summary["mean_num_tool_calls"] == 0.5  # one cell in two samples
    assert run["config"]["benchmarks"]["aime24"]["samples"] == 1 and run["run_dir"] == str(written.run_dir)
    assert run["files"] == sorted(FILES)  # every report the runner writes
    assert run["samples"] == {"aime24": {"count": 2, "mean_score": 0.5}}


def test_samples_filter_page_and_full_record(served_run):
    client, written = served_run
    right, wrong = str(written.right_doc["id"]), str(written.wrong_doc["id"])
    page = client.get(f"/v1/evals/runs/{written.run_id}/samples", params={"benchmark": "aime24", "limit": 1, "offset": 1}).json()
    assert page["total"] == 2 and [s["doc_id"] for s in page["data"]] == [max(right, wrong)]  # ordered by doc id
    assert "trajectory" not in page["data"][0]  # the list stays small; the drill-down has the rest
    assert client.get(f"/v1/evals/runs/{written.run_id}/samples", params={"benchmark": "gpqa"}).json()["total"] == 0
    ids = sample_ids(client, written.run_id)
    sample = client.get(f"/v1/evals/runs/{written.run_id}/samples/{ids[right]}").json()
    assert (sample["score"], sample["num_turns"], sample["num_tool_calls"]) == (1.0, 2, 1)
    assert sample["grade"]["predicted"] == written.right_doc["answer"] and sample["prompt_tokens"] > 0
    assert sample["request"]["messages"][-1]["content"] == written.right_doc["problem"]
    cell = sample["trajectory"]["tool_calls"][0]
    # What the sandbox printed for the model's cell, as the agent loop recorded it.
    assert cell["arguments"]["code"] == written.code and cell["stdout"] == f"{written.right_doc['answer']}\n" and cell["exec_status"] == "ok"
    # ... and drawn as a chat answer's code cell, for the UI to show as it shows a chat
    assert sample["code_cells"] == [{"index": 0, "name": cell["name"], "code": written.code, "status": "ok", "stdout": cell["stdout"], "stderr": "", "duration_s": cell["exec_duration_s"],
                                    "images": [], "image_notes": []}]
    missed = client.get(f"/v1/evals/runs/{written.run_id}/samples/{ids[wrong]}").json()
    assert (missed["score"], missed["num_tool_calls"]) == (0.0, 0) and missed["trajectory"]["tool_calls"] == [] and missed["code_cells"] == []


def test_unknown_run_and_sample_are_404(served_run):
    client, written = served_run
    some_sample = next(iter(sample_ids(client, written.run_id).values()))
    assert client.get("/v1/evals/runs/nope").json()["error"]["type"] == "not_found_error"
    assert client.get("/v1/evals/runs/nope/samples").status_code == 404
    assert client.get(f"/v1/evals/runs/{written.run_id}/samples/999999").status_code == 404
    assert client.get(f"/v1/evals/runs/nope/samples/{some_sample}").status_code == 404  # a sample of another run


def test_files_are_served_from_the_run_dir_only(served_run, tmp_path):
    client, written = served_run
    (tmp_path / "secret.md").write_text("not for readers")
    link = written.run_dir / "link.md"
    link.symlink_to(tmp_path / "secret.md")
    try:
        png = client.get(f"/v1/evals/runs/{written.run_id}/files/scores.png")
        assert png.status_code == 200 and png.headers["content-type"] == "image/png" and png.content.startswith(b"\x89PNG")
        assert client.get(f"/v1/evals/runs/{written.run_id}/files/report.md").text.startswith(f"# Eval run {written.run_id}")
        for name in ("..%2Fsecret.md", "%2E%2E%2Fsecret.md", "link.md", "missing.png", "report.py", ".hidden.md"):
            response = client.get(f"/v1/evals/runs/{written.run_id}/files/{name}")
            assert response.status_code == 404, name
            assert "not for readers" not in response.text
    finally:
        link.unlink()


def _scripted_app(settings, tokenizer):
    from rstar.app import build_app

    async def factory():
        return ScriptedEngine(tokenizer, ["stored answer"])

    return build_app(settings, factory, "scripted", sandbox_factory=ScriptedSandbox)


def test_the_api_mounts_them_behind_its_api_key(tmp_path, default_tokenizer):
    settings = load_settings(data_dir=tmp_path, api_key="sekret")
    sessions = open_database(settings.resolved_database_url)
    written = write_eval_run(sessions, tmp_path / "runs", default_tokenizer)
    close_database(sessions)
    with TestClient(_scripted_app(settings, default_tokenizer)) as client:
        assert client.get("/v1/evals/runs").status_code == 401
        listed = client.get("/v1/evals/runs", headers={"Authorization": "Bearer sekret"})
        assert listed.status_code == 200 and [run["id"] for run in listed.json()["data"]] == [written.run_id]


def test_the_app_reaches_its_database_through_one_engine(tmp_path, default_tokenizer, monkeypatch):
    """Conversations, eval reads and RL runs share the engine the app opened at start-up: no route opens its own."""
    from rstar.server import db

    opened = []
    make_engine = db.make_engine
    monkeypatch.setattr(db, "make_engine", lambda url: opened.append(url) or make_engine(url))
    settings = load_settings(data_dir=tmp_path, enable_rl=True)
    with TestClient(_scripted_app(settings, default_tokenizer), base_url="http://localhost") as client:
        assert client.post("/v1/chat/completions", json={"model": "scripted", "messages": [{"role": "user", "content": "keep me"}]}).status_code == 200
        assert [c["title"] for c in client.get("/v1/conversations").json()["data"]] == ["keep me"]
        assert client.get("/v1/evals/runs").json()["total"] == 0
        assert client.get("/v1/rl/runs").json()["data"] == []
        assert client.get("/v1/rl/runs/nope").status_code == 404
        assert client.post("/v1/rl/runs", json={"recipe": "cpu", "data": "/etc/passwd"}).status_code == 400  # refused before any run row
        assert client.get("/v1/rl/runs").json()["data"] == []
    assert opened == [settings.resolved_database_url]
