"""The zygote's answer to a call, built from what the child wrote and how it ended (no process needed)."""

from __future__ import annotations

import json
import signal

from rstar.sandbox.child import Child
from rstar.sandbox.jobs import Job, answer
from rstar.sandbox.sessions import SessionTable


def _job(timeout_s: float = 2.0, session: str | None = None, keep: int = 1000, **request) -> Job:
    child = Child(pid=100, uid=None, scratch="/tmp/cells/slot0", out=10, err=11, job=12, status=13, born=0.0)
    return Job({"id": 7, "timeout_s": timeout_s, **request}, child, keep, session, now=50.0)


def _status(job: Job, message) -> None:
    assert job.take_status((json.dumps(message) + "\n").encode())
    job.parse_status()


def test_the_childs_status_line_gives_status_and_exit_code():
    job = _job()
    job.take_output("out", b"hello\n")
    _status(job, {"status": "error", "exit_code": 1})
    result = answer(job, max_output_chars=100, now=50.25)
    assert result == {"id": 7, "status": "error", "exit_code": 1, "stdout": "hello\n", "stderr": "",
                      "stdout_truncated": False, "stderr_truncated": False, "duration_s": 0.25}


def test_a_kill_reason_wins_over_what_the_child_said():
    job = _job()
    _status(job, {"status": "ok", "exit_code": 0})
    job.kill_reason = "output_limit"
    assert answer(job, 100, 51.0)["status"] == "output_limit"


def test_a_status_the_zygote_does_not_know_is_an_error_and_internal_errors_explain_themselves():
    job = _job()
    _status(job, {"status": "pwned", "exit_code": "zero"})
    assert (answer(job, 100, 51.0)["status"], answer(job, 100, 51.0)["exit_code"]) == ("error", None)
    job = _job()
    job.take_output("err", b"partial")
    _status(job, {"status": "internal_error", "detail": "hardening failed: OSError"})
    assert answer(job, 100, 51.0)["stderr"] == "partial\nhardening failed: OSError"


def test_an_unreadable_status_line_is_an_error():
    job = _job()
    assert job.take_status(b"{not json\n")
    job.parse_status()
    assert answer(job, 100, 51.0)["status"] == "error"


def test_without_a_status_line_the_exit_status_decides():
    job = _job()
    job.child.exit_status = signal.SIGXCPU  # waitpid status of a process killed by that signal
    assert (answer(job, 100, 51.0)["status"], answer(job, 100, 51.0)["exit_code"]) == ("timeout", -signal.SIGXCPU)
    job.child.exit_status = 3 << 8  # exited with status 3
    assert (answer(job, 100, 51.0)["status"], answer(job, 100, 51.0)["exit_code"]) == ("error", 3)


def test_output_is_counted_in_full_kept_up_to_the_budget_and_clipped_to_the_char_limit():
    job = _job(keep=8)
    job.take_output("out", b"0123456789")
    job.take_output("err", b"abc")
    assert job.over_output_cap(12) and not job.over_output_cap(13)
    _status(job, {"status": "ok", "exit_code": 0})
    result = answer(job, max_output_chars=2, now=51.0)
    assert (result["stdout"], result["stdout_truncated"]) == ("01", True)
    assert (result["stderr"], result["stderr_truncated"]) == ("ab", True)
    assert answer(job, max_output_chars=-1, now=51.0)["stderr_truncated"] is False


def test_released_calls_get_code_judges_extra_second_and_session_answers_say_if_the_session_is_new():
    assert _job(timeout_s=2.0).deadline == 52.0
    assert _job(timeout_s=2.0, protocol="released").deadline == 53.0
    job = _job(session="chat-1")
    job.session_new = True
    _status(job, {"status": "ok", "exit_code": 0, "value": True})
    result = answer(job, 100, 51.0)
    assert (result["session_new"], result["value"]) == (True, True)


def test_the_session_table_evicts_the_idle_session_used_longest_ago_and_expires_idle_ones():
    table = SessionTable(max_sessions=2, ttl_s=10.0)
    for sid, now in (("a", 1.0), ("b", 2.0)):
        table.add(sid, table.reserve_index(), _job().child, now)
    assert table.reserve_index() is None
    assert table.least_recently_used_idle() == "a"
    table.get("a").job = _job(session="a")  # busy sessions are never evicted nor expired
    assert table.least_recently_used_idle() == "b"
    assert table.expired(now=12.5) == ["b"]
    assert table.expiries() == [12.0]
    table.remove("b")
    assert table.reserve_index() == 1
