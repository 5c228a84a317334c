"""The mounted UI: served at /ui, and behind the API key when the server has one."""

from __future__ import annotations

import tempfile

from fastapi import FastAPI
from fastapi.testclient import TestClient

from rstar.ui.app import mount_ui
from rstar.ui.scratch import Scratch

NOWHERE = "http://127.0.0.1:9"  # the page's server calls are not exercised here


def test_the_ui_is_served_at_ui_with_its_components():
    with TestClient(mount_ui(FastAPI(), NOWHERE)) as client:
        assert client.get("/ui/").status_code == 200
        config = client.get("/ui/config").text
    assert '"elem_id":"chatbot"' in config and '"elem_id":"eval-runs"' in config


def test_with_an_api_key_the_ui_asks_for_it():
    with TestClient(mount_ui(FastAPI(), NOWHERE, api_key="sekret")) as client:
        assert client.get("/ui/config").status_code == 401
        assert client.post("/ui/login", data={"username": "me", "password": "wrong"}).status_code == 400
        assert client.post("/ui/login", data={"username": "me", "password": "sekret"}).status_code == 200
        assert '"elem_id":"chatbot"' in client.get("/ui/config").text


def test_the_idle_queue_does_not_spin_in_the_apis_event_loop():
    from rstar.ui.app import IDLE_QUEUE_POLL_S, build_ui

    scratch = Scratch()
    try:
        assert build_ui("http://127.0.0.1:1", scratch)._queue.sleep_when_free == IDLE_QUEUE_POLL_S >= 0.05
    finally:
        scratch.close()


def test_the_download_directory_goes_when_the_app_stops(tmp_path, monkeypatch):
    # Not at interpreter exit, which a server stopped by a signal never reaches (test_serve_cli stops a real one).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with TestClient(mount_ui(FastAPI(), NOWHERE)) as client:
        assert client.get("/ui/").status_code == 200
        assert len(list(tmp_path.glob("rstar-ui-*"))) == 1
    assert list(tmp_path.glob("rstar-ui-*")) == []
