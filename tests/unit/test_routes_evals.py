"""The read-only eval endpoints, over a run inserted as the runner writes one; mounted on a bare app with the
API's error handlers, and once through `create_app` to check the API key guards them."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from rstar.config import load_settings
from fastapi import FastAPI

from rstar.server.db import open_database
from rstar.server.errors import install_error_handlers
from rstar.server.routes_evals import evals_router
from tests.eval_run_data import SUMMARY, insert_eval_run
from tests.scripted_engine import ScriptedEngine


@pytest.fixture
def served_run(tmp_path):
    """(test client, run id, sample ids, run dir)."""
    url = f"sqlite:///{tmp_path / 'rstar.db'}"
    run_id, sample_ids = insert_eval_run(open_database(url), tmp_path / "run")
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(evals_router(url))
    return TestClient(app), run_id, sample_ids, tmp_path / "run"


def test_runs_list_and_detail(served_run):
    client, run_id, _, _ = served_run
    with client:
        runs = client.get("/v1/evals/runs").json()
        assert runs["total"] == 1 and runs["data"][0]["id"] == run_id and runs["data"][0]["status"] == "finished"
        run = client.get(f"/v1/evals/runs/{run_id}").json()
    assert run["summary"] == SUMMARY
    assert run["files"] == ["report.json", "report.md", "scores.png"]
    assert run["samples"] == {"aime24": {"count": 2, "mean_score": 0.5}}


def test_samples_filter_page_and_full_record(served_run):
    client, run_id, sample_ids, _ = served_run
    with client:
        page = client.get(f"/v1/evals/runs/{run_id}/samples", params={"benchmark": "aime24", "limit": 1, "offset": 1}).json()
        assert page["total"] == 2 and [s["doc_id"] for s in page["data"]] == ["2024-I-2"]
        assert "trajectory" not in page["data"][0]  # the list stays small; the drill-down has the rest
        assert client.get(f"/v1/evals/runs/{run_id}/samples", params={"benchmark": "gpqa"}).json()["total"] == 0
        sample = client.get(f"/v1/evals/runs/{run_id}/samples/{sample_ids[0]}").json()
    assert sample["score"] == 1.0 and sample["grade"]["extracted"] == "1170"
    assert sample["trajectory"]["tool_calls"][0]["stdout"] == "1170\n"


def test_unknown_run_and_sample_are_404(served_run):
    client, run_id, sample_ids, _ = served_run
    with client:
        assert client.get("/v1/evals/runs/nope").json()["error"]["type"] == "not_found_error"
        assert client.get("/v1/evals/runs/nope/samples").status_code == 404
        assert client.get(f"/v1/evals/runs/{run_id}/samples/999999").status_code == 404
        assert client.get(f"/v1/evals/runs/nope/samples/{sample_ids[0]}").status_code == 404  # a sample of another run


def test_files_are_served_from_the_run_dir_only(served_run, tmp_path):
    client, run_id, _, run_dir = served_run
    (tmp_path / "secret.md").write_text("not for readers")
    (run_dir / "link.md").symlink_to(tmp_path / "secret.md")
    with client:
        png = client.get(f"/v1/evals/runs/{run_id}/files/scores.png")
        assert png.status_code == 200 and png.headers["content-type"] == "image/png" and png.content.startswith(b"\x89PNG")
        assert client.get(f"/v1/evals/runs/{run_id}/files/report.md").text.startswith("# Eval report")
        for name in ("..%2Fsecret.md", "%2E%2E%2Fsecret.md", "link.md", "missing.png", "report.py", ".hidden.md"):
            response = client.get(f"/v1/evals/runs/{run_id}/files/{name}")
            assert response.status_code == 404, name
            assert "not for readers" not in response.text


def test_the_api_mounts_them_behind_its_api_key(tmp_path, default_tokenizer):
    from rstar.server.api import create_app

    settings = load_settings(data_dir=tmp_path, api_key="sekret")
    insert_eval_run(open_database(settings.resolved_database_url), tmp_path / "run")

    async def factory():
        return ScriptedEngine(default_tokenizer, ["unused"])

    with TestClient(create_app(settings, factory, "scripted")) as client:
        assert client.get("/v1/evals/runs").status_code == 401
        assert client.get("/v1/evals/runs", headers={"Authorization": "Bearer sekret"}).status_code == 200
