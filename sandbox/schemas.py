"""Wire models: our run request/result, and rStar2-Agent's code-judge shapes so its tooling can point here.

`RunResult` is the one record of an execution: the server's tool loop renders the model's `Tool call
success|failure` text from it and keeps it in the trajectory. `code_judge_reason` is the one place that maps
our statuses onto code-judge's `reason` values, for the code-judge endpoint and that text alike.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from .tools import PYTHON_TOOL, ToolProtocol
from .verify import RewardRule

# What the API's containers are called (server/containers.py: 128 random bits); nothing else names a directory.
CONTAINER_ID = r"^cntr_[0-9a-f]{32}$"

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "queue_timeout", "invalid_input", "internal_error"]


class RunRequest(BaseModel):
    """One tool call. `history` holds earlier jupyter_code cells of the same trajectory (replayed silently);
    `session_id` instead keeps a live interpreter between calls (chat)."""

    model_config = ConfigDict(extra="forbid")

    tool: StrictStr = Field(PYTHON_TOOL, description="python_code_with_standard_io (alias execute_python_code_with_standard_io) or jupyter_code.")
    code: StrictStr
    input: StrictStr | None = Field(None, description="Text piped to stdin.")
    history: list[StrictStr] = Field(default_factory=list, description="jupyter_code: earlier cells, oldest first.")
    session_id: StrictStr | None = Field(None, description="Run in a persistent session (state kept between calls).")
    container_id: StrictStr | None = Field(
        None, pattern=CONTAINER_ID, description="Run in this container's interpreter (its globals kept between calls), in its data dir, "
        "which the code also sees at /mnt/data; needs the sandbox's containers_dir.")
    memory_mb: int | None = Field(
        None, ge=64, le=65536, description="Container cells only: address space the code may map beyond the warm image (a container's memory_limit); default memory_mb as the whole cap.")
    timeout_s: float | None = Field(None, gt=0, description="Wall-clock limit; default and ceiling come from the settings.")
    protocol: ToolProtocol = Field(
        "improved",
        description="Result semantics. released: as code-judge ran rStar2-Agent's wrapper (error line '{Err} at line N: {msg}' + two-space "
        "raw line from the deepest frame, no stdout after an uncaught exception, 'Suicide from timeout.' on the wall timeout, 256+128 MB "
        "of address space above a fresh python3). improved: this sandbox's own (stdout kept, errors located in the cell's own frames).",
    )


class CellImage(BaseModel):
    """A figure the cell drew (matplotlib), as PNG."""

    format: Literal["png"] = "png"
    width: int = Field(ge=1)
    height: int = Field(ge=1)
    # Checked as base64 here because a cell process wrote it: it goes into data URLs and pages as is.
    data: str = Field(pattern=r"^[A-Za-z0-9+/]*={0,2}$", description="The PNG, base64-encoded.")

    def data_url(self) -> str:
        return f"data:image/{self.format};base64,{self.data}"


class RunResult(BaseModel):
    status: Status
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = Field(0.0, description="Time the cell ran (from hand-off to the child until it was done).")
    queue_s: float = Field(0.0, description="Time the call waited for a worker.")
    session_new: bool | None = Field(None, description="Session mode: true when this call started a fresh interpreter.")
    images: list[CellImage] = Field(default_factory=list, description="The figures the cell drew, in the order it made them (sandbox/figures.py).")
    image_notes: list[str] = Field(default_factory=list, description="Why figures were left out (a cap: max_images_per_cell, max_image_pixels, max_image_bytes).")

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.exit_code == 0


def error_result(status: Status, message: str) -> RunResult:
    return RunResult(status=status, stderr=message)


class BatchResult(BaseModel):
    results: list[RunResult]


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    response: StrictStr
    gold: StrictStr
    timeout_s: float | None = Field(None, gt=0)
    rule: RewardRule = "boxed"


class VerifyResult(BaseModel):
    correct: bool
    status: Status = Field(description="ok when the checker ran to the end; timeout/error otherwise (then correct is false).")
    duration_s: float = 0.0
    detail: str = ""


# ------------------------------------------------------------------------------------------ code-judge
CodeJudgeReason = Literal["", "worker_timeout", "queue_timeout", "internal_error", "invalid_input"]


class CodeJudgeSubmission(BaseModel):
    """code-judge's `Submission`; `solution` is validated by us so a bad one yields a result, not a 422."""

    sub_id: str | None = None
    type: str
    options: dict[str, Any] | None = None
    solution: Any = None
    input: Any = None
    expected_output: str | None = None


class CodeJudgeResult(BaseModel):
    sub_id: str
    success: bool
    run_success: bool
    cost: float
    stdout: str | None = None
    stderr: str | None = None
    reason: CodeJudgeReason = ""


class CodeJudgeBatch(BaseModel):
    sub_id: str | None = None
    type: Literal["batch"] = "batch"
    submissions: list[Any] = Field(..., min_length=1)


class CodeJudgeBatchResult(BaseModel):
    sub_id: str
    results: list[CodeJudgeResult]


_REASONS: dict[str, CodeJudgeReason] = {
    "timeout": "worker_timeout",
    "queue_timeout": "queue_timeout",
    "internal_error": "internal_error",
    "invalid_input": "invalid_input",
}


def code_judge_reason(status: str) -> CodeJudgeReason:
    """Why a run failed, as code-judge names it: '' for a clean run or a program error."""
    return _REASONS.get(status, "")


def to_code_judge(result: RunResult, sub_id: str | None = None, expected_output: str | None = None) -> CodeJudgeResult:
    """Our result in code-judge's shape: run_success is a clean exit; success also checks expected_output."""
    run_success = result.ok
    success = run_success
    if expected_output is not None:
        success = run_success and _same_output(result.stdout, expected_output)
    return CodeJudgeResult(
        sub_id=sub_id or str(uuid.uuid4()),
        success=success,
        run_success=run_success,
        cost=result.duration_s,
        stdout=result.stdout,
        stderr=result.stderr,
        reason=code_judge_reason(result.status),
    )


def _same_output(got: str, expected: str) -> bool:
    def norm(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip().splitlines()]

    return norm(got) == norm(expected)


def request_from_submission(sub: CodeJudgeSubmission) -> RunRequest | RunResult:
    """A code-judge submission as our request, or the invalid_input result explaining why it cannot run."""
    if sub.type != "python":
        return error_result("invalid_input", f"unsupported submission type {sub.type!r}: this sandbox runs python")
    if not isinstance(sub.solution, str):
        return error_result("invalid_input", f"solution must be a string, not {type(sub.solution).__name__}")
    if sub.input is not None and not isinstance(sub.input, str):
        return error_result("invalid_input", f"input must be a string, not {type(sub.input).__name__}")
    return RunRequest(code=sub.solution, input=sub.input)


def parse_run_request(obj: Any) -> RunRequest | RunResult:
    """Validate one of our requests; a clear invalid_input result instead of an exception."""
    if isinstance(obj, RunRequest):
        return obj
    try:
        return RunRequest.model_validate(obj)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}" for e in exc.errors())
        return error_result("invalid_input", f"invalid request: {problems}")


def is_code_judge(obj: Any) -> bool:
    return isinstance(obj, dict) and ("solution" in obj or "submissions" in obj)
