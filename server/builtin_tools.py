"""The tools the server runs itself (named in `rstar.sandbox.tools`): their schemas, and how one parsed
call turns into a sandbox execution and the response text the model sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Sequence
from typing import Protocol

from rstar.sandbox.clients import SandboxClient
from rstar.sandbox.schemas import RunRequest, RunResult
from rstar.sandbox.tools import BUILTIN_TOOLS, JUPYTER_TOOL, PYTHON_TOOL, ToolProtocol, ToolSettings
from rstar.server.tool_calls import ToolCall
from rstar.server.tool_results import decode_failure_text, execution_error_text, render_exec_result, truncate_response
from rstar.server.trajectory import ToolCallRecord


def python_tool_schema(name: str = PYTHON_TOOL) -> dict:
    """The stdin/stdout tool, described as in the paper's prompt (Fig. 3), under either alias."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": (
                "Execute Python code with standard input and capture standard output. This function takes a Python "
                "code string and an input string, provides the input string through standard input (stdin) to the "
                "code, and captures and returns any output produced through standard output (stdout). If the executed "
                "code raises an exception, the error message will be captured and returned instead."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {
                        "type": "string",
                        "description": "A string containing Python code to be executed. The code can read from standard input using the input() function.",
                    },
                    "input": {
                        "type": "string",
                        "description": "A string that will be provided as standard input to the code when it calls input().",
                    },
                },
                "required": ["code", "input"],
            },
        },
    }


def jupyter_tool_schema() -> dict:
    return {
        "type": "function",
        "function": {
            "name": JUPYTER_TOOL,
            "description": (
                "Run a Python cell as in a Jupyter notebook: variables, functions and imports from earlier cells "
                "stay defined, and the value of a final bare expression is shown."
            ),
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The Python code of the cell."}},
                "required": ["code"],
            },
        },
    }


def builtin_tool_schemas(names: Sequence[str] = (PYTHON_TOOL,)) -> list[dict]:
    """Schemas to list in the prompt, in the given order."""
    unknown = set(names) - BUILTIN_TOOLS
    if unknown:
        raise ValueError(f"not built-in tools: {sorted(unknown)}")
    return [jupyter_tool_schema() if name == JUPYTER_TOOL else python_tool_schema(name) for name in names]


class CodeExecutor(Protocol):
    """What runs code: `SandboxExecutor` over any sandbox client, or a scripted stand-in in tests."""

    async def execute(self, tool: str, code: str, stdin: str, replay: Sequence[str], protocol: ToolProtocol = "improved") -> RunResult:
        """Run `code` as `tool` with `stdin`, after silently replaying the `replay` cells in the same namespace;
        `protocol` says whose result semantics the sandbox follows (code-judge's under `released`)."""
        ...


class SandboxExecutor:
    """Runs calls through a sandbox client (`rstar.sandbox.clients`: in-process, HTTP or Ray).

    `cells`: how many of its calls may run at once. The API gives each request an executor of its own with
    the request's share, so one request's choices cannot take every sandbox worker from the rest."""

    def __init__(self, client: SandboxClient, timeout_s: float | None = None, cells: int | None = None):
        self.client = client
        self.timeout_s = timeout_s  # None: the sandbox's default
        self.container_id: str | None = None
        self.memory_mb: int | None = None
        self._cells = asyncio.Semaphore(cells) if cells is not None else contextlib.nullcontext()

    def in_container(self, container_id: str, memory_mb: int) -> "SandboxExecutor":
        """The same sandbox and share of it, running every cell in that container's interpreter and directory."""
        executor = copy.copy(self)
        executor.container_id, executor.memory_mb = container_id, memory_mb
        return executor

    def with_timeout(self, timeout_s: float | None) -> "SandboxExecutor":
        """The same sandbox and share of it with another limit per execution (a request's `tool_timeout`)."""
        executor = copy.copy(self)
        executor.timeout_s = timeout_s
        return executor

    async def execute(self, tool: str, code: str, stdin: str, replay: Sequence[str], protocol: ToolProtocol = "improved") -> RunResult:
        stdin_or_none = None if tool == JUPYTER_TOOL else stdin
        # A container's interpreter keeps its globals: earlier cells are already run there, not replayed.
        history = [] if self.container_id else list(replay)
        request = RunRequest(tool=tool, code=code, input=stdin_or_none, history=history, timeout_s=self.timeout_s, protocol=protocol,
                             container_id=self.container_id, memory_mb=self.memory_mb)
        async with self._cells:
            return await self.client.run(request)


async def run_builtin_call(
    turn: int,
    call: ToolCall,
    executor: CodeExecutor,
    jupyter_cells: Sequence[str],
    tools: ToolSettings | None = None,
) -> ToolCallRecord:
    """Run one parsed call of assistant turn `turn` (a decode failure or unknown name short-circuits) and
    record its response and execution.

    jupyter_cells: the code of earlier `jupyter_code` calls in this conversation, replayed first.
    tools: the protocol and the cut of the result text; default the improved protocol's.
    Only an execution's text is truncated; error messages are short and pass whole, as released.
    """
    tools = tools or ToolSettings.of_protocol("improved")
    protocol = tools.tool_protocol
    record, started_at = ToolCallRecord.of_call(turn, call), time.time()
    if call.decode_error is not None:
        return record.answer(decode_failure_text(call.decode_error), started_at)
    if not isinstance(call.name, str) or call.name not in BUILTIN_TOOLS:
        # The released loop's KeyError text for a tool it does not have, e.g. "'WolframAlpha'".
        return record.answer(execution_error_text(repr(call.name)), started_at)
    if (error := call.arguments_error(protocol)) is not None:
        return record.answer(execution_error_text(error), started_at)
    replay = jupyter_cells if call.name == JUPYTER_TOOL else ()
    clock = time.perf_counter()
    try:
        result = await executor.execute(call.name, call.code, call.stdin, replay, protocol)
    except Exception as exc:  # the sandbox itself failed; the model is told, the trajectory goes on
        return record.answer(execution_error_text(str(exc)), started_at, time.perf_counter() - clock)
    response = truncate_response(render_exec_result(result, protocol), tools.max_tool_response_chars, tools.tool_response_truncate_side)
    return record.answer(response, started_at, time.perf_counter() - clock, result)
