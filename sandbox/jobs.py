"""A call in flight and the answer frame it becomes.

A `Job` collects what its child wrote (output kept up to a byte budget, everything counted against the
output cap), the child's one-line status report, and why the zygote stopped it, if it did. `answer` turns
that into the result frame the pool reads. Nothing here touches a process or an fd: the answer is a function
of the bytes the zygote read, how the child ended, and the time.
"""

from __future__ import annotations

import json
import os
import signal

from .child import Child

STATUS_MAX = 64 * 1024  # a status line without images (the probe's, a verify's)
# code-judge's worker waited one second past the limit for a program whose own timer failed to fire.
RELEASED_DEADLINE_GRACE_S = 1.0
CHILD_STATUSES = ("ok", "error", "memory", "timeout", "internal_error", "invalid_input")


class Job:
    def __init__(self, request: dict, child: Child, keep_bytes: int, session: str | None, now: float,
                 status_max: int = STATUS_MAX) -> None:
        self.id = request["id"]
        self.request = request
        self.child = child
        self.session = session
        self.started = now
        grace = RELEASED_DEADLINE_GRACE_S if request.get("protocol") == "released" else 0.0
        self.deadline = self.started + float(request["timeout_s"]) + grace
        self.out = bytearray()
        self.err = bytearray()
        self.seen = {"out": 0, "err": 0}
        self.keep = keep_bytes
        self.status_buf = bytearray()
        self.status_max = status_max  # the longest status line kept: room for the images the caps allow
        self.status_eof = False
        self.message: dict | None = None
        self.kill_reason: str | None = None
        self.kill_detail: str | None = None  # why, for the caller, when the reason alone does not say
        self.session_new = False

    def take_output(self, stream: str, data: bytes) -> None:
        """Count every byte; keep only the first `keep` of each stream (the answer is clipped anyway)."""
        buf = self.out if stream == "out" else self.err
        self.seen[stream] += len(data)
        if len(buf) < self.keep:
            buf += data[: self.keep - len(buf)]

    def over_output_cap(self, max_output_bytes: int) -> bool:
        return self.seen["out"] + self.seen["err"] > max_output_bytes

    def take_status(self, data: bytes) -> bool:
        """Add bytes of the status pipe; True once the child's status line is complete. Past `status_max` the
        bytes are dropped: the line then never completes, and the child's exit status answers."""
        kept = data[: max(0, self.status_max - len(self.status_buf))]
        self.status_buf += kept
        return b"\n" in kept  # only the new bytes are searched: a line with images comes in many reads

    def parse_status(self) -> None:
        if b"\n" not in self.status_buf:
            return
        line = bytes(self.status_buf).split(b"\n", 1)[0]
        try:
            message = json.loads(line)
            self.message = message if isinstance(message, dict) else {"status": "error"}
        except ValueError:
            self.message = {"status": "error", "detail": "unreadable status from the cell process"}


def refusal(job_id, status: str, detail: str) -> dict:
    """The answer to a call that never reached a child (no free slot, busy session)."""
    return {"id": job_id, "status": status, "exit_code": None, "stdout": "", "stderr": detail,
            "stdout_truncated": False, "stderr_truncated": False, "duration_s": 0.0}


def answer(job: Job, max_output_chars: int, now: float) -> dict:
    """The result frame: the zygote's kill reason wins, then the child's own status, then its exit status."""
    stdout, out_cut = _clip(job.out, job.seen["out"], max_output_chars)
    stderr, err_cut = _clip(job.err, job.seen["err"], max_output_chars)
    exit_code = None
    value = None
    if job.kill_reason is not None:
        status = job.kill_reason
        if job.kill_detail:
            stderr = (stderr + "\n" if stderr else "") + job.kill_detail
    elif job.message is not None:
        status = job.message.get("status")
        exit_code = job.message.get("exit_code")
        value = job.message.get("value")
        if status not in CHILD_STATUSES:
            status = "error"
        if status == "internal_error" and job.message.get("detail"):
            stderr = (stderr + "\n" if stderr else "") + str(job.message["detail"])
        if not isinstance(exit_code, int):
            exit_code = None
    else:
        raw = job.child.exit_status or 0
        if os.WIFSIGNALED(raw):
            sig = os.WTERMSIG(raw)
            exit_code = -sig
            status = "timeout" if sig == signal.SIGXCPU else "error"
        else:
            exit_code = os.WEXITSTATUS(raw)
            status = "ok" if exit_code == 0 else "error"
    result = {"id": job.id, "status": status, "exit_code": exit_code, "stdout": stdout, "stderr": stderr,
              "stdout_truncated": out_cut, "stderr_truncated": err_cut, "duration_s": round(now - job.started, 6)}
    if value is not None:
        result["value"] = value
    if job.message is not None and job.kill_reason is None:
        for key in ("images", "image_notes"):
            if job.message.get(key):
                result[key] = job.message[key]
    if job.session is not None:
        result["session_new"] = job.session_new
    return result


def _clip(data: bytearray, seen: int, max_chars: int) -> tuple[str, bool]:
    text = bytes(data).decode("utf-8", "replace")
    cut = seen > len(data)
    if max_chars >= 0 and len(text) > max_chars:
        text, cut = text[:max_chars], True
    return text, cut
