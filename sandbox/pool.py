"""The pool: one zygote process, a bounded wait for its workers, and the tool semantics on top.

Everything that runs code goes through `SandboxPool.run` (or `verify`). The pool never queues more than
`max_queue` calls, answers `queue_timeout` for calls that waited too long, restarts a zygote that died (the
calls it held get `internal_error`), and refuses to start without isolation unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import tempfile
import time
from typing import Any

from rstar.process_temp import owned_temp_dir

from . import launch, protocol
from .metrics import PoolMetrics
from .schemas import RunRequest, RunResult, VerifyResult, error_result, parse_run_request
from .settings import SandboxSettings
from .tools import BUILTIN_TOOLS, JUPYTER_TOOL
from .verify import REWARD_RULES, RewardRule

log = logging.getLogger("rstar.sandbox")

# How long past a call's own deadline we wait for the zygote before declaring it stuck and restarting it.
ZYGOTE_GRACE_S = 10.0
START_TIMEOUT_S = 120.0


class ZygoteProcess:
    """The zygote subprocess and its request/answer bookkeeping."""

    def __init__(self, plan: launch.LaunchPlan) -> None:
        self.plan = plan
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.ids = itertools.count(1)
        self.report: dict = {}
        self._reader: asyncio.Task | None = None
        self._stderr: asyncio.Task | None = None
        self._write_lock = asyncio.Lock()
        self.stopping = False
        self.scratch_host_dir: tempfile.TemporaryDirectory | None = None  # unsafe mode only: the cells' host dir

    @property
    def alive(self) -> bool:
        # The reader ends at the zygote's EOF, possibly before asyncio has collected its exit status.
        reading = self._reader is None or not self._reader.done()
        return self.proc is not None and self.proc.returncode is None and reading

    async def start(self) -> dict:
        config = self.plan.config
        if not self.plan.isolated:
            self.scratch_host_dir = owned_temp_dir("rstar-cells-")
            config = {**config, "scratch_root": self.scratch_host_dir.name}
        self.proc = await asyncio.create_subprocess_exec(
            *self.plan.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"}, close_fds=True, start_new_session=True)
        self._stderr = asyncio.create_task(self._log_stderr())
        self.proc.stdin.write(protocol.encode(config))
        await self.proc.stdin.drain()
        try:
            ready = await asyncio.wait_for(protocol.read_frame_async(self.proc.stdout), START_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            await self.stop()
            raise RuntimeError(f"the zygote did not start: {type(exc).__name__}: {exc}") from exc
        if ready.get("op") != "ready":
            await self.stop()
            raise RuntimeError(f"the zygote sent {ready!r} instead of its ready report")
        self.report = ready.get("report", {})
        self._reader = asyncio.create_task(self._read_answers())
        return self.report

    async def _read_answers(self) -> None:
        try:
            while True:
                message = await protocol.read_frame_async(self.proc.stdout)
                future = self.pending.pop(message.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            if not self.stopping:
                log.error("zygote channel closed: %s", exc)
        finally:
            for future in self.pending.values():
                if not future.done():
                    future.set_result({"status": "internal_error", "stderr": "the sandbox zygote exited; it is being restarted"})
            self.pending.clear()

    async def _log_stderr(self) -> None:
        async for line in self.proc.stderr:
            log.warning("zygote: %s", line.decode("utf-8", "replace").rstrip())

    async def call(self, message: dict, wait_s: float) -> dict:
        call_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.pending[call_id] = future
        try:
            async with self._write_lock:
                self.proc.stdin.write(protocol.encode({**message, "id": call_id}))
                await self.proc.stdin.drain()
            return await asyncio.wait_for(future, wait_s)  # only this call holds the future: nothing to shield
        except (ConnectionError, AttributeError):
            return {"status": "internal_error", "stderr": "the sandbox zygote is not running"}
        except asyncio.CancelledError:
            # The caller is gone (a client disconnected): have the zygote kill the cell now; left alone it would
            # run to its deadline, holding a worker. Its answer then finds no one waiting and is dropped.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.send({"op": "cancel", "job": call_id}))
            raise
        finally:
            self.pending.pop(call_id, None)

    async def send(self, message: dict) -> None:
        async with self._write_lock:
            self.proc.stdin.write(protocol.encode(message))
            await self.proc.stdin.drain()

    async def stop(self) -> None:
        try:
            await self._stop_process()
        finally:
            if self.scratch_host_dir:  # once the zygote is gone, no cell is still writing into it
                self.scratch_host_dir.cleanup()

    async def _stop_process(self) -> None:
        if self.proc is None:
            return
        self.stopping = True
        if self.proc.returncode is None:
            try:
                self.proc.stdin.close()
                await asyncio.wait_for(self.proc.wait(), 3)
            except (asyncio.TimeoutError, ConnectionError, OSError):
                pass
        if self.proc.returncode is None:
            self.proc.kill()  # bwrap's --die-with-parent and the pid namespace take the rest down
            await self.proc.wait()
        for task in (self._reader, self._stderr):
            if task is not None:
                task.cancel()


class SandboxPool:
    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self.metrics = PoolMetrics()
        self.host: launch.HostReport | None = None
        self.layers: dict = {}
        self._zygote: ZygoteProcess | None = None
        self._slots = asyncio.Semaphore(self.settings.workers)
        self._waiting = 0
        self._running = 0
        self._start_lock = asyncio.Lock()
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> "SandboxPool":
        await self._ensure_zygote()
        return self

    async def __aenter__(self) -> "SandboxPool":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _ensure_zygote(self) -> ZygoteProcess:
        if self._zygote is not None and self._zygote.alive:
            return self._zygote
        async with self._start_lock:
            if self._zygote is not None and self._zygote.alive:
                return self._zygote
            if self._closed:
                raise RuntimeError("the sandbox pool is closed")
            if self._zygote is not None:
                self.metrics.zygote_restarts += 1
                log.error("the sandbox zygote died; starting a new one")
                await self._zygote.stop()
            if self.host is None:
                self.host = await asyncio.to_thread(launch.detect_host, self.settings)
            plan = launch.plan(self.settings, self.host)
            zygote = ZygoteProcess(plan)
            report = await zygote.start()
            if "error" in report:
                await zygote.stop()
                raise launch.IsolationError(f"a hardened cell could not start: {report['error']}")
            self.layers = launch.describe_layers(self.settings, self.host, plan, report)
            self._check_layers(plan)
            self._zygote = zygote
            log.info("sandbox ready: %d workers, preload %.2f s, layers %s", self.settings.workers,
                     report.get("warmup_s", 0), ", ".join(n for n, l in self.layers.items() if l["active"]))
            return zygote

    def _check_layers(self, plan: launch.LaunchPlan) -> None:
        if not plan.isolated:
            log.warning("UNSAFE: the sandbox runs model code WITHOUT isolation (--unsafe-no-isolation): no "
                        "namespaces, seccomp or Landlock; only rlimits and the wall timeout. Never on a shared machine.")
            return
        missing = [name for name in launch.REQUIRED_LAYERS if not self.layers[name]["active"]]
        for name, layer in self.layers.items():
            if not layer["active"] and name != "cgroups":  # cgroups are not used by design (health says why)
                log.warning("sandbox layer %s is NOT active: %s", name, layer["detail"])
        if missing:
            raise launch.IsolationError("isolation layers failed their check inside a cell: " + ", ".join(
                f"{n} ({self.layers[n]['detail']})" for n in missing) + ". Pass --unsafe-no-isolation to run anyway.")

    async def close(self) -> None:
        self._closed = True
        if self._zygote is not None:
            await self._zygote.stop()

    # ------------------------------------------------------------------------------------- calls
    async def run(self, request: RunRequest | dict, queue_timeout_s: float | None = None) -> RunResult:
        """Run one tool call; never raises for anything the caller or the cell did wrong.

        `queue_timeout_s` overrides how long the call may wait for a worker (code-judge's long batches)."""
        started = time.monotonic()
        parsed = parse_run_request(request)
        if isinstance(parsed, RunResult):
            result = parsed
        else:
            problem = self._check_request(parsed)
            result = error_result("invalid_input", problem) if problem else await self._run_valid(parsed, queue_timeout_s)
        self.metrics.observe(result.status, time.monotonic() - started)
        return result

    async def run_batch(self, requests: list, queue_timeout_s: float | None = None) -> list[RunResult]:
        """Run many calls concurrently (bounded by the workers); results come back in request order."""
        return list(await asyncio.gather(*(self.run(r, queue_timeout_s) for r in requests)))

    def _check_request(self, request: RunRequest) -> str | None:
        s = self.settings
        if request.tool not in BUILTIN_TOOLS:
            return f"unknown tool {request.tool!r}; known: {', '.join(sorted(BUILTIN_TOOLS))}"
        if len(request.code) > s.max_code_chars:
            return f"code has {len(request.code)} characters; the limit is {s.max_code_chars}"
        if request.input is not None and len(request.input) > s.max_input_chars:
            return f"input has {len(request.input)} characters; the limit is {s.max_input_chars}"
        if request.history and request.tool != JUPYTER_TOOL:
            return f"history is only meaningful for {JUPYTER_TOOL}"
        if request.history and (request.session_id or request.container_id):
            return "use either history (replay) or a live interpreter (session_id, container_id), not both"
        if request.container_id and request.session_id:
            return "a container is a session of its own: give container_id or session_id, not both"
        if request.container_id and not s.containers_dir:
            return "this sandbox has no containers_dir: it cannot run cells in containers"
        if request.memory_mb is not None and not request.container_id:
            return "memory_mb is a container's: it needs container_id"
        if sum(len(c) for c in request.history) > s.max_code_chars * 4:
            return "history is too large to replay"
        for text in (request.code, request.input or "", *request.history):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return "code, input and history must be valid Unicode (lone surrogates are not)"
        return None

    async def _run_valid(self, request: RunRequest, queue_timeout_s: float | None = None) -> RunResult:
        timeout = min(request.timeout_s or self.settings.timeout_s, self.settings.max_timeout_s)
        history = request.history[-self.settings.max_history_cells:] if request.tool == JUPYTER_TOOL else []
        # A container's cells share one interpreter: the zygote keeps it as the session named by the container's id.
        session = request.session_id or request.container_id
        message = {"op": "run", "kind": "exec", "code": request.code, "stdin": request.input, "history": history, "timeout_s": timeout,
                   "session": session, "container": request.container_id, "memory_mb": request.memory_mb, "protocol": request.protocol}
        if session is None:
            answer, waited = await self._dispatch(message, timeout, queue_timeout_s)
        else:
            lock = self._session_locks.setdefault(session, asyncio.Lock())
            async with lock:
                answer, waited = await self._dispatch(message, timeout, queue_timeout_s)
        return self._to_result(answer, waited)

    async def _dispatch(self, message: dict, timeout: float, queue_timeout_s: float | None) -> tuple[dict, float]:
        """Wait (bounded) for a worker, then hand the message to the zygote."""
        enqueued = time.monotonic()
        if self._waiting >= self.settings.max_queue:
            return {"status": "queue_timeout", "stderr": f"the sandbox queue is full ({self.settings.max_queue} calls waiting)"}, 0.0
        wait_limit = self.settings.queue_timeout_s if queue_timeout_s is None else queue_timeout_s
        self._waiting += 1
        try:
            if self._slots.locked():
                await asyncio.wait_for(self._slots.acquire(), wait_limit)
            else:
                await self._slots.acquire()  # a worker is free: no timer and no task to wrap the wait in
        except asyncio.TimeoutError:
            return {"status": "queue_timeout", "stderr": f"no worker became free within {wait_limit:g} s"}, time.monotonic() - enqueued
        finally:
            self._waiting -= 1
        waited = time.monotonic() - enqueued
        self._running += 1
        try:
            try:
                zygote = await self._ensure_zygote()
            except Exception as exc:  # noqa: BLE001 - reported as the call's result
                log.error("cannot start the sandbox: %s", exc)
                return {"status": "internal_error", "stderr": f"the sandbox cannot start: {exc}"}, waited
            try:
                return await zygote.call(message, timeout + ZYGOTE_GRACE_S), waited
            except asyncio.TimeoutError:
                log.error("the zygote did not answer within %.1f s; restarting it", timeout + ZYGOTE_GRACE_S)
                await zygote.stop()
                return {"status": "internal_error", "stderr": "the sandbox stopped answering; it was restarted"}, waited
        finally:
            self._running -= 1
            self._slots.release()

    @staticmethod
    def _to_result(answer: dict, waited: float) -> RunResult:
        fields = {k: answer[k] for k in RunResult.model_fields if k in answer}
        fields["queue_s"] = round(waited, 6)
        try:
            return RunResult(**fields)
        except Exception as exc:  # noqa: BLE001 - a malformed answer is our bug, not the caller's
            return error_result("internal_error", f"malformed answer from the zygote: {exc}")

    async def verify(self, response: str, gold: str, timeout_s: float | None = None, rule: RewardRule = "boxed") -> VerifyResult:
        """Check a model response against the gold answer inside a sandboxed child, under a timeout, by one of
        `verify.REWARD_RULES`."""
        if not isinstance(response, str) or not isinstance(gold, str):
            return VerifyResult(correct=False, status="invalid_input", detail="response and gold must be strings")
        if rule not in REWARD_RULES:
            return VerifyResult(correct=False, status="invalid_input", detail=f"unknown rule {rule!r}; use one of {', '.join(REWARD_RULES)}")
        timeout = min(timeout_s or self.settings.verify_timeout_s, self.settings.max_timeout_s)
        started = time.monotonic()
        answer, _ = await self._dispatch({"op": "run", "kind": "verify", "response": response, "gold": gold, "rule": rule,
                                          "timeout_s": timeout, "session": None}, timeout, None)
        self.metrics.observe(answer.get("status", "internal_error"), time.monotonic() - started)
        status = answer.get("status", "internal_error")
        return VerifyResult(correct=status == "ok" and answer.get("value") is True, status=status,
                            duration_s=answer.get("duration_s", 0.0), detail=answer.get("stderr", "")[-500:])

    async def close_session(self, session_id: str) -> None:
        """End a session's interpreter (a container's is the session named by its id). A cell running in it
        ends first, by its deadline at most, so its caller gets the cell's own result (the zygote would stop it
        and answer internal_error)."""
        async with self._session_locks.get(session_id) or contextlib.nullcontext():
            zygote = await self._ensure_zygote()
            await zygote.send({"op": "close_session", "session": session_id})
        self._session_locks.pop(session_id, None)

    async def processes(self) -> list[dict]:
        """Processes running as cell uids inside the sandbox (spares, running cells, sessions, strays)."""
        zygote = await self._ensure_zygote()
        answer = await zygote.call({"op": "ps"}, 10)
        return answer.get("processes", [])

    # ------------------------------------------------------------------------------------ reports
    def health(self) -> dict:
        z = self._zygote
        return {
            "status": "ok" if z is not None and z.alive else "starting" if not self._closed else "closed",
            "isolated": not self.settings.unsafe_no_isolation,
            "layers": self.layers,
            "workers": self.settings.workers,
            "running": self._running,
            "queue": {"waiting": self._waiting, "max": self.settings.max_queue},
            "zygote": {"alive": bool(z and z.alive), "pid": z.proc.pid if z and z.proc else None,
                       "restarts": self.metrics.zygote_restarts, "warmup_s": (z.report.get("warmup_s") if z else None),
                       "preloaded": (z.report.get("preloaded") if z else None),
                       "huge_page_mb": (z.report.get("huge_page_mb") if z else None)},
            "limits": {"timeout_s": self.settings.timeout_s, "memory_mb": self.settings.memory_mb,
                       "max_processes": self.settings.max_processes, "max_output_chars": self.settings.max_output_chars,
                       "max_output_bytes": self.settings.max_output_bytes,
                       "released_memory": (z.report.get("released_memory") if z else None)},
        }

    def render_metrics(self) -> str:
        return self.metrics.render(waiting=self._waiting, running=self._running, workers=self.settings.workers)
