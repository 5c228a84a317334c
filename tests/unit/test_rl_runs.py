"""Run bookkeeping on a real SQLite database: begin/resume/conflict, steps never counted twice, cancel."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rstar.rl.runs import RunConflict, RunStore, UnknownRun
from rstar.server.db import RlRun, open_database


@pytest.fixture
def store(tmp_path):
    return RunStore(open_database(f"sqlite:///{tmp_path / 'rstar.db'}"))


def begin(store, run_id="r1", kind="grpo"):
    return store.begin(run_id, kind, "model-dir", {"name": "cpu"}, "data.jsonl", "/runs/r1", 5)


def test_a_new_run_then_the_same_process_resuming_it(store):
    assert begin(store) is False
    store.record_step("r1", 1, "s", {"reward_mean": 0.5})
    assert begin(store) is True  # same process: e.g. a server restarting its own run
    run = store.get("r1")
    assert run["status"] == "running" and run["step"] == 1 and run["steps"][0]["reward_mean"] == 0.5


def test_a_step_redone_after_a_resume_replaces_the_old_row(store):
    begin(store)
    for step in (1, 2, 3):
        store.record_step("r1", step, "s", {"reward_mean": step / 10})
    assert store.forget_steps_after("r1", 1) == 2  # resumed from checkpoint-1
    store.record_step("r1", 2, "s", {"reward_mean": 0.9})
    store.record_step("r1", 2, "s", {"reward_mean": 0.8})
    run = store.get("r1")
    assert [(s["step"], s["reward_mean"]) for s in run["steps"]] == [(1, 0.1), (2, 0.8)]
    assert run["step"] == 2


def test_a_run_whose_process_died_reads_interrupted_and_can_be_taken_over(store):
    begin(store)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    with store.sessions.begin() as session:
        session.get(RlRun, "r1").pid = int(dead)
    assert store.get("r1")["status"] == "interrupted"
    assert store.running() is None
    assert begin(store) is True and store.get("r1")["status"] == "running"


def test_a_run_alive_in_another_process_is_a_conflict(store):
    begin(store)
    with store.sessions.begin() as session:
        session.get(RlRun, "r1").pid = 1  # init: alive, not us
    with pytest.raises(RunConflict, match="already running"):
        begin(store)
    assert store.running()["id"] == "r1"


def test_finished_runs_and_other_kinds_cannot_be_resumed(store):
    begin(store)
    store.finish("r1", "finished")
    with pytest.raises(RunConflict, match="already finished"):
        begin(store)
    with pytest.raises(RunConflict, match="is a grpo run"):
        begin(store, kind="sft")


def test_cancel_sets_the_flag_the_run_reads(store):
    begin(store)
    assert not store.cancel_requested("r1")
    assert store.request_cancel("r1")["cancel_requested"] is True
    assert store.cancel_requested("r1")
    with pytest.raises(UnknownRun):
        store.request_cancel("nope")


def test_checkpoints_listed_until_pruned(store):
    begin(store)
    store.record_checkpoint("r1", 1, "/runs/r1/checkpoint-1", [])
    store.record_checkpoint("r1", 2, "/runs/r1/checkpoint-2", [])
    store.record_checkpoint("r1", 3, "/runs/r1/checkpoint-3", ["/runs/r1/checkpoint-1"])
    assert [c["step"] for c in store.get("r1")["checkpoints"]] == [2, 3]
    assert [r["id"] for r in store.list()] == ["r1"]


def test_an_error_fails_the_run_and_an_interrupt_leaves_it_resumable(store):
    begin(store, "broken")
    with pytest.raises(ValueError), store.failed_on_error("broken"):
        raise ValueError("no problem fits")
    assert (store.get("broken")["status"], store.get("broken")["error"]) == ("failed", "ValueError: no problem fits")
    begin(store, "interrupted")
    with pytest.raises(KeyboardInterrupt), store.failed_on_error("interrupted"):
        raise KeyboardInterrupt
    assert store.get("interrupted")["status"] == "running"  # to the process that owns it; interrupted once it is gone
