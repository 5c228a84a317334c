"""The two tool protocols: the rStar template and the tool-turn bridge against renders of the released
template (an independent reference, tests/reference/rstar_template_renders.json), and each difference
between `released` and `improved` in the agent loop, with the scripted engine."""

from __future__ import annotations

import asyncio

import pytest

from rstar.config import load_settings
from rstar.sandbox.tools import PYTHON_TOOL, ToolSettings
from rstar.server.agent_loop import LoopConfig, run_trajectory
from rstar.server.builtin_tools import builtin_tool_schemas
from rstar.server.chat_template import rstar_template
from rstar.server.engine import SamplingOptions
from rstar.server.model_store import default_tool_protocol
from rstar.server.schemas import CodeCell
from rstar.server.tool_results import tool_turn_ids, tool_turn_text
from rstar.server.trajectory import Trajectory
from tests.released_renders import released_renders
from tests.scripted_engine import call, scripted_engine
from tests.scripted_sandbox import ScriptedSandbox, scripted_sandbox

QUESTION = [{"role": "user", "content": "How many positive divisors does 2024 have?"}]
SAMPLING = SamplingOptions(max_tokens=1, temperature=0.6)
INSTRUCTION = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. "
    "And your final answer will be extracted automatically by the \\boxed{} tag.\nThis is the problem:\n"
)


def test_the_reference_has_all_eight_cases():
    assert len(released_renders()) == 8


FAITHFUL = ["user_with_tools_generation", "user_no_tools_generation", "system_user_with_tools", "system_user_no_tools",
            "tool_call_then_two_results", "unicode_arguments"]  # fmt: skip


@pytest.mark.parametrize("name", FAITHFUL)
def test_rstar_template_renders_as_released(name):
    case = released_renders()[name]
    ours = rstar_template().render(case["messages"], case["tools"], add_generation_prompt=case["add_generation_prompt"])
    assert ours == case["rendered"]


def test_assistant_without_tool_calls_differs_only_by_the_fixed_instruction_prefix():
    case = released_renders()["assistant_without_tool_calls_BUG"]
    ours = rstar_template().render(case["messages"], case["tools"], add_generation_prompt=True)
    content = case["messages"][1]["content"]
    released_turn = f"<|im_start|>assistant\n{INSTRUCTION}{content}<|im_end|>"
    assert case["rendered"].count(released_turn) == 1  # the flaw the reference documents
    assert ours == case["rendered"].replace(released_turn, f"<|im_start|>assistant\n{content}<|im_end|>")


def test_bridge_released_is_the_released_loop_suffix_and_improved_adds_one_newline(default_tokenizer):
    case = released_renders()["released_loop_tool_turn_suffix"]
    template = rstar_template(default_tokenizer)
    responses = [message["content"] for message in case["messages"]]
    assert tool_turn_text(template, responses, "<|im_end|>", "released") == case["rendered"]
    assert tool_turn_text(template, responses, "<|im_end|>", "improved") == "\n" + case["rendered"]
    released_ids = tool_turn_ids(template, responses, "<|im_end|>", "released")
    assert released_ids == default_tokenizer.encode(case["rendered"], add_special_tokens=False)
    assert tool_turn_ids(template, responses, "<|im_end|>", "improved")[1:] == released_ids


def run(tokenizer, turns, protocol, sandbox=None, max_tool_response_chars=None, **config) -> tuple[Trajectory, ScriptedSandbox]:
    sandbox = sandbox or scripted_sandbox({"print(2 + 3)": "5\n"})
    loop = LoopConfig(tools=ToolSettings(tool_protocol=protocol, max_tool_response_chars=max_tool_response_chars), **config)
    tools = builtin_tool_schemas([PYTHON_TOOL])
    trajectory = asyncio.run(run_trajectory(scripted_engine(tokenizer, turns), rstar_template(tokenizer), QUESTION, tools, SAMPLING, sandbox.executor(), loop))
    return trajectory, sandbox


ONE_CALL = ["Add them.\n" + call("print(2 + 3)"), "Five.</reason>\n<answer>\\boxed{5}</answer>"]


@pytest.mark.parametrize("protocol", ["released", "improved"])
def test_token_stream_per_protocol_matches_the_released_loop_where_it_should(default_tokenizer, protocol):
    """The prompt is the released template's render; after the model's <|im_end|> the released stream goes
    straight to <|im_start|>user (the reference suffix), the improved one has the template's newline."""
    cases = released_renders()
    trajectory, sandbox = run(default_tokenizer, ONE_CALL, protocol)
    released_prompt = cases["user_with_tools_generation"]["rendered"].replace("What is 1+2+...+100?", QUESTION[0]["content"])
    assert default_tokenizer.decode(trajectory.prompt_ids) == released_prompt
    first = trajectory.turns[0]
    tool_span = trajectory.response_ids[first.end : trajectory.turns[1].start]
    suffix = cases["released_loop_tool_turn_suffix"]
    expected = suffix["rendered"].replace(suffix["messages"][0]["content"], trajectory.tool_calls[0].response)
    assert default_tokenizer.decode(tool_span) == ("" if protocol == "released" else "\n") + expected
    assert trajectory.response_ids[first.end - 1] == default_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert trajectory.tool_protocol == protocol
    assert [request.protocol for request in sandbox.requests] == [protocol]


def test_arguments_as_a_json_string_are_answered_as_released(default_tokenizer):
    as_string = 'Add them.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": "{\\"code\\": \\"print(2 + 3)\\"}"}\n</tool_call>'
    released, sandbox = run(default_tokenizer, [as_string, "Done."], "released")
    assert released.tool_calls[0].response == "Error when executing tool: 'str' object has no attribute 'get'"
    assert sandbox.requests == []
    improved, sandbox = run(default_tokenizer, [as_string, "Done."], "improved")
    assert improved.tool_calls[0].response.startswith("Tool call success\nstdout: 5")
    assert sandbox.codes == ["print(2 + 3)"]
    # Either way the client is shown the code the call carries.
    cells = [CodeCell.of_record(trajectory.tool_calls[0]) for trajectory in (released, improved)]
    assert [(cell.code, cell.status) for cell in cells] == [("print(2 + 3)", "invalid_input"), ("print(2 + 3)", "ok")]


@pytest.mark.parametrize("protocol", ["released", "improved"])
def test_a_tool_never_registered_gets_the_released_key_error_text(default_tokenizer, protocol):
    trajectory, sandbox = run(default_tokenizer, ["Ask.\n" + call("2+2", name="WolframAlpha"), "Done."], protocol)
    assert trajectory.tool_calls[0].response == "Error when executing tool: 'WolframAlpha'" and sandbox.requests == []


@pytest.mark.parametrize("protocol", ["released", "improved"])
def test_only_the_first_call_of_a_turn_runs(default_tokenizer, protocol):
    two = "Two at once.\n" + call("print(2 + 3)") + "\n" + call("print(7)")
    trajectory, sandbox = run(default_tokenizer, [two, "Done."], protocol)
    assert sandbox.codes == ["print(2 + 3)"] and len(trajectory.tool_calls) == 1


def test_second_cut_is_256_middle_under_released_and_none_under_improved(default_tokenizer):
    released, improved = ToolSettings.of_protocol("released"), ToolSettings.of_protocol("improved")
    assert (released.max_tool_response_chars, improved.max_tool_response_chars) == (256, None)
    # The server's setting overrides the protocol's cut; 0 keeps every result whole.
    assert [ToolSettings.of_protocol("improved", chars).max_tool_response_chars for chars in (100, 0)] == [100, None]
    assert ToolSettings.of_protocol("released", 0).max_tool_response_chars is None
    long = "".join(f"{i:04d}\n" for i in range(200))
    trajectory, _ = run(default_tokenizer, ONE_CALL, "released", scripted_sandbox({"print(2 + 3)": long}), max_tool_response_chars=released.max_tool_response_chars)
    response = trajectory.tool_calls[0].response
    whole = f"Tool call success\nstdout: {long}\nexecution time: 0.25s"
    assert response == whole[:128] + "...(truncated)..." + whole[-128:]
    trajectory, _ = run(default_tokenizer, ONE_CALL, "improved", scripted_sandbox({"print(2 + 3)": long}))
    assert trajectory.tool_calls[0].response == whole


def test_default_protocol_per_model_and_the_setting(monkeypatch):
    assert default_tool_protocol("rStar2-Agent-14B") == "released"
    assert default_tool_protocol("microsoft/rStar2-Agent-14B") == "released"
    # The embedded default was trained on the improved loop's trajectories.
    assert default_tool_protocol("SmolLM2-135M-rStar-Tool") == default_tool_protocol("default") == "improved"
    assert default_tool_protocol("Qwen/Qwen3-14B") == "improved"
    monkeypatch.setenv("RSTAR_API__TOOL_PROTOCOL", "released")
    monkeypatch.setenv("RSTAR_API__MAX_TOOL_RESPONSE_CHARS", "0")
    settings = load_settings()
    assert (settings.api.tool_protocol, settings.api.max_tool_response_chars) == ("released", 0)
    monkeypatch.setenv("RSTAR_API__TOOL_PROTOCOL", "paper")
    with pytest.raises(ValueError, match="released"):
        load_settings()
