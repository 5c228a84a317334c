"""`rstar sandbox serve` as a real process: our API, code-judge's API, bad input, health, metrics, HTTP client."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from rstar.sandbox.clients import HttpClient, LocalClient, SandboxClient, connect
from rstar.sandbox.procs import cell_processes
from rstar.sandbox.schemas import RunResult, to_code_judge
from tests.processes import wait_until_serving


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sandbox_service():
    port = _free_port()
    env = {**os.environ, "RSTAR_SANDBOX__MAX_CODE_CHARS": "5000", "RSTAR_SANDBOX__UID_BASE": "63000"}
    proc = subprocess.Popen([sys.executable, "-m", "rstar.sandbox.cli", "serve", "--port", str(port),
                             "--workers", "2", "--timeout", "2"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stdout.read().decode()
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("sandbox service did not become healthy")
    with httpx.Client(base_url=url, timeout=60) as client:
        yield client
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def test_run_our_shape(sandbox_service):
    body = sandbox_service.post("/run", json={"code": "print(input() * 2)", "input": "ab"}).json()
    assert body["status"] == "ok" and body["stdout"] == "abab\n" and body["exit_code"] == 0
    assert {"stdout_truncated", "stderr_truncated", "duration_s"} <= set(body)


def test_run_code_judge_shape(sandbox_service):
    body = sandbox_service.post("/run", json={"type": "python", "solution": "print(int(input()) + 1)", "input": "41"}).json()
    assert set(body) == {"sub_id", "success", "run_success", "cost", "stdout", "stderr", "reason"}
    assert (body["success"], body["run_success"], body["stdout"], body["reason"]) == (True, True, "42\n", "")
    timed_out = sandbox_service.post("/run", json={"type": "python", "solution": "while True: pass"}).json()
    assert (timed_out["success"], timed_out["reason"]) == (False, "worker_timeout")
    failed = sandbox_service.post("/run", json={"sub_id": "s1", "type": "python", "solution": "1/0"}).json()
    assert (failed["sub_id"], failed["run_success"], failed["reason"]) == ("s1", False, "")
    assert failed["stderr"].startswith("ZeroDivisionError at line 1")


def test_code_judge_expected_output(sandbox_service):
    ok = sandbox_service.post("/run", json={"type": "python", "solution": "print(3)", "expected_output": "3\n"}).json()
    wrong = sandbox_service.post("/run", json={"type": "python", "solution": "print(4)", "expected_output": "3"}).json()
    assert (ok["success"], wrong["success"], wrong["run_success"]) == (True, False, True)


def test_batch_results_keep_request_order(sandbox_service):
    requests = [{"code": f"import time; time.sleep({0.2 if i % 3 == 0 else 0}); print({i})"} for i in range(9)]
    body = sandbox_service.post("/run/batch", json={"requests": requests}).json()
    assert [r["stdout"] for r in body["results"]] == [f"{i}\n" for i in range(9)]
    as_list = sandbox_service.post("/run/batch", json=requests[:2]).json()
    assert [r["stdout"] for r in as_list["results"]] == ["0\n", "1\n"]


@pytest.mark.parametrize("path", ["/run/batch", "/run/long-batch"])
def test_code_judge_batches(sandbox_service, path):
    subs = [{"type": "python", "solution": f"print({i})"} for i in range(5)] + [{"type": "cpp", "solution": "int main(){}"}]
    body = sandbox_service.post(path, json={"type": "batch", "submissions": subs}).json()
    assert [r["stdout"] for r in body["results"][:5]] == [f"{i}\n" for i in range(5)]
    assert body["results"][5]["reason"] == "invalid_input" and "sub_id" in body


def test_bad_json_is_a_clear_400(sandbox_service):
    response = sandbox_service.post("/run", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["status"] == "invalid_input" and "not valid JSON" in response.json()["stderr"]


@pytest.mark.parametrize("payload, fragment", [
    ({"code": 123}, "code"),
    ({"code": ["print(1)"]}, "code"),
    ({}, "code"),
    ({"code": "x" * 6000}, "limit is 5000"),
    ({"code": "print(1)", "tool": "WolframAlpha"}, "unknown tool"),
    ({"code": "print(1)", "input": 5}, "input"),
    ({"code": "print(1)", "surprise": True}, "surprise"),
    ({"code": "print(1)", "timeout_s": -1}, "timeout_s"),
    ({"code": "1", "history": ["x = 1"]}, "history"),
    ([1, 2], "request"),
])
def test_invalid_requests_get_invalid_input(sandbox_service, payload, fragment):
    body = sandbox_service.post("/run", json=payload).json()
    assert body["status"] == "invalid_input" and fragment in body["stderr"]


def test_bad_items_fail_alone_in_a_batch(sandbox_service):
    body = sandbox_service.post("/run/batch", json={"requests": [{"code": "print(1)"}, {"code": None}, "junk"]}).json()
    assert [r["status"] for r in body["results"]] == ["ok", "invalid_input", "invalid_input"]
    body = sandbox_service.post("/run", json={"type": "python", "solution": 12}).json()
    assert body["reason"] == "invalid_input" and "string" in body["stderr"]
    assert sandbox_service.post("/run/batch", json={"requests": 7}).status_code == 422


def test_service_survives_garbage(sandbox_service):
    for payload in (b"", b"null", b"\xff\xfe", b"[" * 10000, b'{"code": "\\ud800"}'):
        response = sandbox_service.post("/run", content=payload, headers={"content-type": "application/json"})
        assert response.status_code in (200, 400)
        assert response.json()["status"] == "invalid_input"
    assert sandbox_service.post("/run", json={"code": "print('alive')"}).json()["stdout"] == "alive\n"


def test_verify_endpoint(sandbox_service):
    assert sandbox_service.post("/verify", json={"response": r"<answer>\boxed{025}</answer>", "gold": "25"}).json()["correct"]
    assert sandbox_service.post("/verify", json={"response": 5, "gold": "5"}).status_code == 422


def test_health_lists_every_layer(sandbox_service):
    health = sandbox_service.get("/health").json()
    assert health["status"] == "ok" and health["isolated"] is True
    for name in ("namespaces", "rlimits", "uid_per_slot", "no_new_privs", "seccomp", "landlock", "fd_hygiene",
                 "env_scrub", "wall_timeout", "cgroups"):
        assert set(health["layers"][name]) == {"active", "detail"}
    assert all(health["layers"][n]["active"] for n in ("namespaces", "seccomp", "rlimits", "no_new_privs"))


def test_metrics(sandbox_service):
    sandbox_service.post("/run", json={"code": "print(1)"})
    text = sandbox_service.get("/metrics").text
    assert 'rstar_sandbox_calls_total{status="ok"}' in text
    assert "rstar_sandbox_call_seconds_bucket" in text and "rstar_sandbox_workers 2" in text


def test_http_client_matches_local_client(sandbox_service):
    async def both():
        results = []
        for client in (HttpClient(str(sandbox_service.base_url)), LocalClient()):
            assert isinstance(client, SandboxClient)
            async with client:
                one = await client.run({"code": "print(6 * 7)"})
                many = await client.run_batch([{"code": "1 + 1"}, {"code": "1/0"}])
                verdict = await client.verify(r"\boxed{2}", "2")
                session = [await client.run({"code": c, "session_id": "s"}) for c in ("a = 5", "a")]
                await client.close_session("s")
                await client.close_container("cntr_" + "0" * 32)  # no interpreter of it here: nothing to end, no error
                results.append((one.stdout, [r.status for r in many], verdict.correct, session[1].stdout,
                                (await client.health())["status"]))
        return results

    http, local = asyncio.run(both())
    assert http == local == ("42\n", ["ok", "error"], True, "5\n", "ok")


CANCEL_UID_BASE = 65000  # this test's own service, so counting host processes by uid sees only its cells


def _live_cells() -> set[int]:
    return {pid for pid, _uid, state in cell_processes(CANCEL_UID_BASE, 16) if state not in ("Z", "X")}


def test_a_client_that_goes_away_cancels_its_cell(tmp_path):
    """Cancelling the HTTP client's call mid-cell closes its connection; the service then has the zygote kill
    the cell at once, where it used to run to its 30 s deadline on a worker nobody waited for."""
    port = _free_port()
    env = {**os.environ, "RSTAR_SANDBOX__UID_BASE": str(CANCEL_UID_BASE)}
    log = tmp_path / "service.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "rstar.sandbox.cli", "serve", "--port", str(port),
                                 "--workers", "2", "--timeout", "30"], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, f"{url}/health", log, 60)

        def running() -> int:
            return httpx.get(f"{url}/health", timeout=5).json()["running"]

        async def start_then_leave() -> None:
            async with HttpClient(url) as client:
                call = asyncio.create_task(client.run({"code": "import time\ntime.sleep(60)", "timeout_s": 30}))
                deadline = time.monotonic() + 10
                while await asyncio.to_thread(running) != 1:
                    assert time.monotonic() < deadline and not call.done(), "the cell never started"
                    await asyncio.sleep(0.05)
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call

        deadline = time.monotonic() + 10
        while len(before := _live_cells()) < 4:  # the pre-forked spares (2 workers + 2), one of which takes the call
            assert time.monotonic() < deadline, f"spares never all started: {before}"
            time.sleep(0.05)
        asyncio.run(start_then_leave())
        deadline = time.monotonic() + 5
        while (running(), len(before - _live_cells())) != (0, 1):
            assert time.monotonic() < deadline, f"running {running()}, spares then {before}, cells now {_live_cells()}"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_http_client_reports_a_dead_service_as_internal_error():
    async def call():
        async with connect(url=f"http://127.0.0.1:{_free_port()}") as client:
            return await client.run({"code": "print(1)"})

    assert asyncio.run(call()).status == "internal_error"


@pytest.mark.parametrize("status, reason", [("ok", ""), ("error", ""), ("timeout", "worker_timeout"),
                                            ("queue_timeout", "queue_timeout"), ("internal_error", "internal_error"),
                                            ("invalid_input", "invalid_input"), ("memory", ""), ("output_limit", "")])
def test_to_code_judge_maps_every_status(status, reason):
    result = RunResult(status=status, exit_code=0 if status == "ok" else 1, stdout="o", stderr="e", duration_s=0.5)
    cj = to_code_judge(result, "id-1")
    assert (cj.reason, cj.run_success, cj.success, cj.cost, cj.sub_id) == (reason, status == "ok", status == "ok", 0.5, "id-1")


def test_cli_refuses_to_run_without_isolation():
    env = {**os.environ, "RSTAR_SANDBOX__BWRAP_PATH": "/nonexistent/bwrap"}
    proc = subprocess.run([sys.executable, "-m", "rstar.sandbox.cli", "serve", "--port", str(_free_port())],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "bubblewrap" in proc.stderr and "--unsafe-no-isolation" in proc.stderr
