"""Tool-call parsing (whole turns and streamed deltas split at every position), result rendering and
built-in tool dispatch, against golden files."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from golden_files import check_json

from rstar.sandbox.schemas import RunResult
from rstar.sandbox.tools import JUPYTER_TOOL, PYTHON_TOOL, PYTHON_TOOL_PAPER_NAME, ToolSettings
from rstar.server.builtin_tools import run_builtin_call
from rstar.server.tool_calls import (
    CALL_CLOSE,
    CALL_OPEN,
    TextDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallEnded,
    ToolCallStarted,
    ToolCallStreamParser,
    parse_tool_calls,
)
from rstar.server.tool_results import render_exec_result, truncate_response
from rstar.server.schemas import CodeCell
from rstar.server.trajectory import ToolCallRecord
from tests.scripted_sandbox import ScriptedSandbox

CALL = '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(2024 % 7)", "input": ""}}\n</tool_call>'

# Turn texts as the model might write them (after the prompt's forced `<reason>`).
TURNS = {
    "one_call": "I will compute it.\n" + CALL,
    "no_call": "2024 = 2^3 * 11 * 23, so (3+1)(1+1)(1+1) = 16.</reason>\n<answer>\\boxed{16}</answer>",
    "two_calls": 'Two things.\n<tool_call>\n{"name": "jupyter_code", "arguments": {"code": "x = 3"}}\n</tool_call>\n'
    '<tool_call>{"name": "jupyter_code", "arguments": {"code": "x ** 2"}}</tool_call>',
    "malformed_json": 'Try.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)"}\n</tool_call>',
    "not_an_object": "<tool_call>[1, 2]</tool_call>",
    "missing_name": '<tool_call>{"arguments": {"code": "1"}}</tool_call>',
    "arguments_as_string": '<tool_call>{"name": "python_code_with_standard_io", "arguments": "{\\"code\\": \\"print(5)\\", \\"input\\": \\"\\"}"}</tool_call>',
    "unknown_tool": '<tool_call>{"name": "WolframAlpha", "arguments": {"query": "divisors of 2024"}}</tool_call>',
    "keys_reordered": '<tool_call>{"arguments": {"code": "print(3)"}, "name": "jupyter_code"}</tool_call>',
    "braces_and_tags_inside_code": '<tool_call>{"name": "jupyter_code", "arguments": {"code": "s = \\"}</reason><tool_call\\"\\nprint(s)"}}  </tool_call>',
    "unterminated": "Let me check.\n" + CALL[:-len(CALL_CLOSE) - 3],
    "second_open_tag_inside": "<tool_call>oops <tool_call>" + CALL[len(CALL_OPEN):],
    "answer_then_reasoning_again": "Done.</reason><answer>\\boxed{1}</answer><reason>Actually, check.\n" + CALL,
    # JSON allows only \" \\ \/ \b \f \n \r \t \uXXXX; a model may write LaTeX-style escapes anyway.
    "invalid_escape_in_name": '<tool_call>{"name": "python\\_code", "arguments": {"code": "print(1)"}}</tool_call>',
    "unicode": 'Größe π.\n<tool_call>{"name": "jupyter_code", "arguments": {"code": "print(\'π≈3.14\')"}}</tool_call>',
}


def call_dict(call: ToolCall) -> dict:
    return {"index": call.index, "raw": call.raw, "name": call.name, "arguments": call.arguments, "decode_error": call.decode_error}


def stream(text: str, cuts: list[int]) -> tuple[list, ToolCallStreamParser]:
    parser = ToolCallStreamParser(in_reasoning=True)
    events, previous = [], 0
    for cut in [*cuts, len(text)]:
        events += parser.feed(text[previous:cut])
        previous = cut
    return events + parser.finish(), parser


def merged(events: list) -> list:
    """Events with consecutive text (same kind) and argument deltas joined: the same for any split."""
    out: list = []
    for event in events:
        if isinstance(event, TextDelta):
            if out and out[-1][0] == ("reasoning" if event.reasoning else "content"):
                out[-1][1] += event.text
            else:
                out.append(["reasoning" if event.reasoning else "content", event.text])
        elif isinstance(event, ToolCallArgumentsDelta):
            if out and out[-1][0] == "arguments" and out[-1][1] == event.index:
                out[-1][2] += event.text
            else:
                out.append(["arguments", event.index, event.text])
        elif isinstance(event, ToolCallStarted):
            out.append(["call_started", event.index, event.name])
        else:
            out.append(["call_ended", call_dict(event.call), event.complete])
    return out


@pytest.mark.parametrize("name", sorted(TURNS))
def test_parse_golden(name):
    check_json(f"tool_calls/parse_{name}.json", [call_dict(call) for call in parse_tool_calls(TURNS[name])])


@pytest.mark.parametrize("name", sorted(TURNS))
def test_stream_golden(name):
    events, _ = stream(TURNS[name], [])
    check_json(f"tool_calls/stream_{name}.json", merged(events))


@pytest.mark.parametrize("name", sorted(TURNS))
def test_stream_is_the_same_split_at_every_position(name):
    text = TURNS[name]
    whole = merged(stream(text, [])[0])
    for cut in range(len(text) + 1):
        events, parser = stream(text, [cut])
        assert merged(events) == whole, f"split at {cut}: {text[:cut]!r} | {text[cut:]!r}"
        assert parser.calls == parse_tool_calls(text)
    events, _ = stream(text, list(range(len(text))))  # one character at a time
    assert merged(events) == whole


# Quadratic in length: the short turns only; the single-split test covers the long ones.
@pytest.mark.parametrize("name", sorted(name for name, text in TURNS.items() if len(text) <= 140))
def test_split_at_every_pair_of_positions(name):
    text = TURNS[name]
    whole = merged(stream(text, [])[0])
    for first in range(len(text) + 1):
        for second in range(first, len(text) + 1):
            assert merged(stream(text, [first, second])[0]) == whole, (first, second)


@pytest.mark.parametrize("name", sorted(TURNS))
def test_no_tag_ever_reaches_text(name):
    events, _ = stream(TURNS[name], list(range(len(TURNS[name]))))
    text = "".join(event.text for event in events if isinstance(event, TextDelta))
    for tag in (CALL_OPEN, CALL_CLOSE, "</reason>"):
        assert tag not in text


@pytest.mark.parametrize("name", sorted(TURNS))
def test_streamed_arguments_are_the_raw_arguments_text(name):
    """Argument deltas of a well-formed call concatenate to JSON that decodes to its arguments."""
    events, parser = stream(TURNS[name], list(range(len(TURNS[name]))))
    for call in parser.calls:
        if call.decode_error is None:
            text = "".join(e.text for e in events if isinstance(e, ToolCallArgumentsDelta) and e.index == call.index)
            assert json.loads(text) == call.arguments


def test_every_call_is_announced_once_before_its_arguments_and_ended_once():
    events, _ = stream(TURNS["two_calls"] + TURNS["malformed_json"], [7, 50, 90])
    kinds = [(type(e).__name__, getattr(e, "index", None) if not isinstance(e, ToolCallEnded) else e.call.index) for e in events if not isinstance(e, TextDelta)]
    for index in (0, 1, 2):
        mine = [kind for kind, i in kinds if i == index]
        assert mine[0] == "ToolCallStarted" and mine[-1] == "ToolCallEnded"
        assert mine.count("ToolCallStarted") == 1 and mine.count("ToolCallEnded") == 1


def test_released_parser_error_texts():
    """The decode errors are Python's own messages, as the released parser reported them."""
    assert parse_tool_calls(TURNS["missing_name"])[0].decode_error == "'name'"
    assert parse_tool_calls(TURNS["malformed_json"])[0].decode_error.startswith("Expecting ',' delimiter")
    assert parse_tool_calls(TURNS["unterminated"]) == []


RESULTS = {
    "success_with_stdout": RunResult(status="ok", exit_code=0, stdout="16\n", duration_s=0.4149),
    "success_silent": RunResult(status="ok", exit_code=0, duration_s=0.004),
    "success_with_stderr": RunResult(status="ok", exit_code=0, stdout="1\n", stderr="DeprecationWarning: x\n", duration_s=1.0),
    "program_error": RunResult(status="error", exit_code=1, stderr="ZeroDivisionError at line 2: division by zero\n    1/0", duration_s=0.02),
    "timeout": RunResult(status="timeout", stdout="partial", duration_s=4.0021),
}


def test_result_rendering_golden():
    check_json("tool_results/rendered.json", {name: render_exec_result(result, "released") for name, result in RESULTS.items()})


def test_truncation_golden():
    text = "".join(str(i % 10) for i in range(40))
    check_json(
        "tool_results/truncated.json",
        {side: truncate_response(text, 10, side) for side in ("left", "right", "middle")} | {"odd_middle": truncate_response(text, 7, "middle")},
    )
    assert truncate_response(text, None) == text
    assert truncate_response(text, 40) == text


def dispatch(text: str, sandbox: ScriptedSandbox | None = None, cells=(), **kwargs):
    sandbox = sandbox or ScriptedSandbox(stdout="ok")
    run = asyncio.run(run_builtin_call(0, parse_tool_calls(text)[0], sandbox.executor(), list(cells), **kwargs))
    return run, sandbox


def test_dispatch_golden():
    responses = {}
    for name in ("one_call", "malformed_json", "not_an_object", "missing_name", "arguments_as_string", "unknown_tool", "keys_reordered"):
        run, _ = dispatch(TURNS[name])
        responses[name] = run.response
    responses["not_json_string_arguments"] = dispatch('<tool_call>{"name": "jupyter_code", "arguments": "print(1)"}</tool_call>')[0].response
    responses["non_string_code"] = dispatch('<tool_call>{"name": "jupyter_code", "arguments": {"code": 12}}</tool_call>')[0].response
    responses["sandbox_unreachable"] = dispatch(TURNS["one_call"], ScriptedSandbox(error=ConnectionError("pool is down")))[0].response
    check_json("tool_results/dispatch.json", responses)
    assert responses["unknown_tool"] == "Error when executing tool: 'WolframAlpha'"
    assert responses["malformed_json"].startswith("Failed to decode tool call: Expecting")


def test_both_names_of_the_python_tool_run_with_stdin():
    for name in (PYTHON_TOOL, PYTHON_TOOL_PAPER_NAME):
        text = f'<tool_call>{{"name": "{name}", "arguments": {{"code": "print(input())", "input": "7"}}}}</tool_call>'
        run, sandbox = dispatch(text, cells=["x = 1"])
        assert [(r.tool, r.code, r.input, r.history) for r in sandbox.requests] == [(name, "print(input())", "7", [])]  # stateless: no replay
        assert run.response == "Tool call success\nstdout: ok\nexecution time: 0.01s"


def test_jupyter_replays_earlier_cells_and_ignores_stdin():
    text = '<tool_call>{"name": "jupyter_code", "arguments": {"code": "x ** 2", "input": "ignored"}}</tool_call>'
    _, sandbox = dispatch(text, cells=["x = 3"])
    assert [(r.tool, r.code, r.input, r.history) for r in sandbox.requests] == [(JUPYTER_TOOL, "x ** 2", None, ["x = 3"])]


def test_only_execution_text_is_truncated():
    long = ScriptedSandbox(stdout="9" * 500, duration_s=0.1)
    run, _ = dispatch(TURNS["one_call"], long, tools=ToolSettings(max_tool_response_chars=64, tool_response_truncate_side="middle"))
    assert run.response.startswith("Tool call success\nstdout: 9") and "...(truncated)..." in run.response
    assert run.response.endswith("execution time: 0.10s")
    error, _ = dispatch(TURNS["unknown_tool"], tools=ToolSettings(max_tool_response_chars=5))
    assert error.response == "Error when executing tool: 'WolframAlpha'"


def test_a_code_cell_is_drawn_from_the_call_record():
    ran, _ = dispatch(TURNS["one_call"])
    timed_out, _ = dispatch(TURNS["one_call"], ScriptedSandbox(status="timeout", duration_s=4.0))
    undecodable, _ = dispatch(TURNS["malformed_json"])
    unknown, _ = dispatch(TURNS["unknown_tool"])
    cells = [CodeCell.of_record(record).model_dump() for record in (ran, timed_out, undecodable, unknown)]
    code = ran.arguments["code"]
    no_figures = {"images": [], "image_notes": []}
    assert cells == [
        {"index": 0, "name": PYTHON_TOOL, "code": code, "status": "ok", "stdout": "ok", "stderr": "", "duration_s": 0.01, **no_figures},
        {"index": 0, "name": PYTHON_TOOL, "code": code, "status": "timeout", "stdout": "", "stderr": "scripted timeout", "duration_s": 4.0, **no_figures},
        {"index": 0, "name": "", "code": undecodable.raw, "status": "invalid_input", "stdout": "", "stderr": undecodable.response, "duration_s": None, **no_figures},
        {"index": 0, "name": "WolframAlpha", "code": unknown.raw, "status": "invalid_input", "stdout": "", "stderr": "Error when executing tool: 'WolframAlpha'", "duration_s": None, **no_figures},
    ]
    assert undecodable.response.startswith("Failed to decode tool call")
    client_call = ToolCallRecord.of_call(0, parse_tool_calls(TURNS["unknown_tool"])[0])  # unanswered: the client runs it
    assert CodeCell.of_record(client_call) is None


def test_a_call_decodes_its_arguments_once_into_code_and_stdin():
    as_object = parse_tool_calls('<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": "print(input())", "input": "7"}}</tool_call>')[0]
    as_string = parse_tool_calls(TURNS["arguments_as_string"])[0]
    jupyter = parse_tool_calls('<tool_call>{"name": "jupyter_code", "arguments": {"code": "x", "input": "ignored"}}</tool_call>')[0]
    listed = parse_tool_calls('<tool_call>{"name": "jupyter_code", "arguments": ["x"]}</tool_call>')[0]
    assert [(call.code, call.stdin) for call in (as_object, jupyter, listed)] == [("print(input())", "7"), ("x", ""), (None, "")]
    assert isinstance(as_string.arguments, str) and as_string.code == json.loads(as_string.arguments)["code"]
    assert [call.arguments_error("improved") for call in (as_object, as_string, jupyter)] == [None, None, None]
    assert as_string.arguments_error("released") == "'str' object has no attribute 'get'"
    assert listed.arguments_error("improved") == "arguments must be a JSON object, not list"


def test_a_stored_record_without_code_decodes_it_when_loaded():
    ran, _ = dispatch(TURNS["arguments_as_string"])
    stored = dataclasses.asdict(ran)
    assert ToolCallRecord.of_stored(stored) == ran
    del stored["code"]
    assert CodeCell.of_record(ToolCallRecord.of_stored(stored)).code == ran.code != ""


def test_sandbox_results_render_as_released():
    """The real in-process sandbox behind SandboxExecutor: statuses map onto code-judge's reasons."""
    from rstar.sandbox.clients import LocalClient
    from rstar.sandbox.settings import SandboxSettings
    from rstar.server.builtin_tools import SandboxExecutor

    async def go():
        async with LocalClient(SandboxSettings(timeout_s=0.5)) as client:
            executor = SandboxExecutor(client)
            texts = {}
            for name, code, stdin, replay in [
                ("stdin", "print(int(input()) * 2)", "21", []),
                ("echo_last_expression", "x = 6\nx * 7", "", []),
                ("replayed_cells", "x + y", "", ["x = 40", "y = 2\nprint('not shown')"]),
                ("program_error", "1/0", "", []),
                ("timeout", "while True: pass", "", []),
            ]:
                tool = JUPYTER_TOOL if replay else PYTHON_TOOL
                texts[name] = render_exec_result(await executor.execute(tool, code, stdin, replay), "released")
            return texts

    texts = asyncio.run(go())
    assert texts["stdin"].startswith("Tool call success\nstdout: 42\n\nexecution time: ")
    assert texts["echo_last_expression"].startswith("Tool call success\nstdout: 42\n")
    assert texts["replayed_cells"].startswith("Tool call success\nstdout: 42\n\nexecution time: ")
    assert texts["program_error"].startswith("Tool call failure\nreason: \nstderr: ZeroDivisionError at line 1: division by zero\n    1/0\n")
    assert texts["timeout"].startswith("Tool call failure\nreason: worker_timeout\nexecution time: 0.5")
