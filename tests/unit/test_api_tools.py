"""The tool loop through the API on a scripted engine and sandbox: built-in code cells (non-stream and
stream), client function tools with every tool_choice, the built-in switch, the forced tool-call path."""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.scripted_engine import call
from tests.unit.api_server import QUESTION, TOOL_TURNS, make_server, sandbox_of  # noqa: F401 (fixture)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def test_builtin_call_runs_in_the_sandbox_and_its_output_reaches_the_model(make_server):
    client, http, engine, _ = make_server(replies=TOOL_TURNS)
    sandbox_of(http).outputs["print(6*7)"] = "42\n"
    completion = client.chat.completions.create(model="scripted", messages=QUESTION)
    message = completion.choices[0].message
    assert message.content.strip() == "The answer is 42."
    assert message.reasoning_content == "Let me compute.The tool says 42."
    assert message.code_cells == [
        {"index": 0, "name": "python_code_with_standard_io", "code": "print(6*7)", "status": "ok", "stdout": "42\n", "stderr": "", "duration_s": 0.01,
         "images": [], "image_notes": []}
    ]
    assert [r.code for r in sandbox_of(http).requests] == ["print(6*7)"]
    second_prompt = engine.tokenizer.decode(engine.prompts[1])
    assert "<tool_response>\nTool call success\nstdout: 42\n\nexecution time: 0.01s\n</tool_response>" in second_prompt
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.tool_calls == 1 and completion.usage.tool_tokens > 0


def test_a_call_whose_arguments_are_a_json_string_shows_the_code_it_ran(make_server):
    """The OpenAI wire form of arguments (a JSON string) runs under `improved`; every view of the call shows
    the code that ran: the chat answer's cell, the streamed final cell and the Responses item."""
    as_string = "<tool_call>\n" + json.dumps({"name": "python_code_with_standard_io", "arguments": json.dumps({"code": "print(6*7)"})}) + "\n</tool_call>"
    turns = ("<reason>Let me compute.</reason>\n" + as_string, TOOL_TURNS[1])
    client, http, _, _ = make_server(replies=turns * 3)
    sandbox_of(http).outputs["print(6*7)"] = "42\n"
    cells = client.chat.completions.create(model="scripted", messages=QUESTION).choices[0].message.code_cells
    assert [(cell["code"], cell["status"]) for cell in cells] == [("print(6*7)", "ok")]
    chunks = client.chat.completions.create(model="scripted", messages=QUESTION, stream=True)
    streamed = [chunk.choices[0].delta.code_cell for chunk in chunks if chunk.choices and getattr(chunk.choices[0].delta, "code_cell", None)]
    assert [(cell["code"], cell["status"]) for cell in streamed] == [("print(6*7)", "running"), ("print(6*7)", "ok")]
    response = client.responses.create(model="scripted", input="What is 6*7?", tools=[{"type": "code_interpreter", "container": {"type": "auto"}}])
    assert [(item.code, item.status) for item in response.output if item.type == "code_interpreter_call"] == [("print(6*7)", "completed")]
    assert [r.code for r in sandbox_of(http).requests] == ["print(6*7)"] * 3


def test_stream_sends_each_cell_when_it_starts_and_when_it_ends(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS)
    sandbox_of(http).outputs["print(6*7)"] = "42\n"
    chunks = list(client.chat.completions.create(model="scripted", messages=QUESTION, stream=True))
    order = []
    for chunk in chunks:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        if getattr(delta, "reasoning_content", None):
            order.append("reasoning")
        if getattr(delta, "code_cell", None):
            order.append("cell:" + delta.code_cell["status"])
        if delta.content:
            order.append("content")
    collapsed = [kind for i, kind in enumerate(order) if i == 0 or order[i - 1] != kind]
    assert collapsed == ["reasoning", "content", "cell:running", "cell:ok", "reasoning", "content"]
    running = next(c.choices[0].delta.code_cell for c in chunks if c.choices and getattr(c.choices[0].delta, "code_cell", None))
    assert running == {"index": 0, "name": "python_code_with_standard_io", "code": "print(6*7)", "status": "running", "stdout": "", "stderr": "", "duration_s": None,
                       "images": [], "image_notes": []}
    assert chunks[0].conversation_id  # stored by default, announced up front
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_client_function_call_comes_back_as_tool_calls(make_server):
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    client, http, _, _ = make_server(replies=(reply,))
    completion = client.chat.completions.create(model="scripted", messages=QUESTION, tools=[WEATHER])
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert choice.message.tool_calls[0].id.startswith("call_")
    assert sandbox_of(http).requests == []


def test_client_function_call_streams_name_then_arguments(make_server):
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    client, _, _, _ = make_server(replies=(reply,))
    chunks = list(client.chat.completions.create(model="scripted", messages=QUESTION, tools=[WEATHER], stream=True))
    pieces = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert pieces[0].function.name == "get_weather" and pieces[0].id.startswith("call_")
    assert len(pieces) > 2  # the arguments arrive in several deltas
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_named_tool_choice_forces_the_call(make_server):
    client, _, engine, _ = make_server(replies=('{"city": "Rome"}}\n</tool_call>',))
    completion = client.chat.completions.create(
        model="scripted", messages=QUESTION, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert engine.tokenizer.decode(engine.prompts[0]).endswith('<tool_call>\n{"name": "get_weather", "arguments": ')
    calls = completion.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Rome"})]


def test_required_tool_choice_opens_a_call(make_server):
    client, _, engine, _ = make_server(replies=('get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',))
    completion = client.chat.completions.create(model="scripted", messages=QUESTION, tools=[WEATHER], tool_choice="required")
    assert engine.tokenizer.decode(engine.prompts[0]).endswith('<tool_call>\n{"name": "')
    assert completion.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_none_hides_client_tools(make_server):
    client, _, engine, _ = make_server()
    client.chat.completions.create(model="scripted", messages=QUESTION, tools=[WEATHER], tool_choice="none")
    prompt = engine.tokenizer.decode(engine.prompts[0])
    assert "get_weather" not in prompt and "python_code_with_standard_io" in prompt


def test_builtin_tools_off_is_plain_chat(make_server):
    client, http, engine, _ = make_server(replies=(call("print(1)"),))
    completion = client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"builtin_tools": False})
    assert "<tools>" not in engine.tokenizer.decode(engine.prompts[0])
    assert sandbox_of(http).requests == []  # the model's call text is an answer like any other
    assert completion.choices[0].message.content == call("print(1)")
    assert len(engine.prompts) == 1


def test_continue_final_message_runs_its_tool_call_first(make_server):
    client, http, engine, _ = make_server(replies=("So it is 42.",))
    sandbox_of(http).outputs["print(6*7)"] = "42\n"
    messages = [*QUESTION, {"role": "assistant", "content": "I will compute it.\n" + call("print(6*7)")}]
    completion = client.chat.completions.create(model="scripted", messages=messages, extra_body={"continue_final_message": True, "return_token_ids": True})
    assert [r.code for r in sandbox_of(http).requests] == ["print(6*7)"]
    prompt = engine.tokenizer.decode(engine.prompts[0])
    # The given message is not closed and reopened: the tool turn follows it directly.
    assert prompt.count("<|im_start|>assistant") == 2
    assert "I will compute it.\n<tool_call>" in prompt and "stdout: 42" in prompt
    message = completion.choices[0].message
    assert message.content == "So it is 42."
    assert message.code_cells[0]["stdout"] == "42\n" and message.code_cells[0]["status"] == "ok"
    choice = completion.choices[0]
    # The response tokens: the tool turn (mask 0), then the sampled answer (mask 1).
    assert engine.prompts[0] == completion.prompt_token_ids + choice.token_ids[: choice.response_mask.index(1)]
    assert sum(choice.response_mask) == completion.usage.completion_tokens


def test_failed_and_refused_calls_are_cells_with_their_status(make_server):
    client, http, _, _ = make_server(replies=(call("while True: pass"), "<tool_call>{not json}</tool_call>", "done"))
    sandbox_of(http).status = "timeout"
    cells = client.chat.completions.create(model="scripted", messages=QUESTION).choices[0].message.code_cells
    assert [(c["index"], c["status"]) for c in cells] == [(0, "timeout"), (1, "invalid_input")]
    assert cells[1]["stderr"].startswith("Failed to decode tool call:")


def test_tool_timeout_and_max_turns_reach_the_loop(make_server):
    client, http, engine, _ = make_server(replies=(call("print(1)"),))
    completion = client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"max_turns": 2, "tool_timeout": 1.5})
    assert len(engine.prompts) == 2  # the model kept calling; the second turn was the last
    assert completion.choices[0].finish_reason == "length"
    assert [r.timeout_s for r in sandbox_of(http).requests] == [1.5]


def test_closing_a_stream_during_a_tool_run_cancels_the_sandbox_job(make_server):
    client, http, engine, _ = make_server(replies=TOOL_TURNS)
    sandbox = sandbox_of(http)
    sandbox.delay_s = 30
    stream = client.chat.completions.create(model="scripted", messages=QUESTION, stream=True)
    for chunk in stream:
        if chunk.choices and getattr(chunk.choices[0].delta, "code_cell", None):
            break
    stream.close()
    deadline = time.time() + 5
    while not sandbox.cancelled and time.time() < deadline:
        time.sleep(0.05)
    assert sandbox.cancelled == ["print(6*7)"]
    assert http.get("/health").json()["admission"]["running"] == 0
    assert "rstar_client_disconnects_total 1.0" in http.get("/metrics").text


def test_a_request_can_choose_the_rstar_template_over_the_models_own(make_server):
    client, _, engine, _ = make_server(replies=("<reason>Easy.</reason>42",))
    client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"builtin_tools": False})
    client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"builtin_tools": False, "chat_template": "rstar"})
    own, rstar = (engine.tokenizer.decode(prompt) for prompt in engine.prompts)
    assert "This is the problem:" not in own  # the default model's own template
    assert "This is the problem:\nWhat is 6*7?" in rstar and rstar.endswith("<|im_start|>assistant\n<reason>")


def test_an_unknown_template_name_is_a_400(make_server):
    client, _, _, _ = make_server()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"chat_template": "jinja-from-the-internet"})
    assert err.value.body["param"] == "chat_template"


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_call_that_does_not_decode_is_not_returned_as_a_call(make_server, stream):
    # The stream parser sees a well-formed start (the name of a client tool) before the JSON breaks; the
    # finished span does not decode, so it is not a call the client could run, whatever was streamed.
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}}\n</tool_call>'
    client, http, _, _ = make_server(replies=(reply,))
    create = dict(model="scripted", messages=QUESTION, tools=[WEATHER], extra_body={"max_turns": 1})
    if stream:
        chunks = list(client.chat.completions.create(**create, stream=True))
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    else:
        choice = client.chat.completions.create(**create).choices[0]
        assert choice.message.tool_calls is None
        assert choice.finish_reason == "length"
    assert len(http.get("/v1/conversations").json()["data"]) == 1  # stored, not lost to a server error


@pytest.mark.parametrize("protocol, between_turns", [(None, "\n"), ("improved", "\n"), ("released", "")])
def test_a_request_picks_its_tool_protocol(make_server, protocol, between_turns):
    """The tool turn after the model's <|im_end|>: a newline under `improved` (this server's default for a
    model whose name does not say rStar), none under `released`, as rStar2-Agent's loop built it."""
    client, http, engine, _ = make_server(replies=TOOL_TURNS)
    sandbox_of(http).outputs["print(6*7)"] = "42\n"
    extra = {"tool_protocol": protocol} if protocol else {}
    client.chat.completions.create(model="scripted", messages=QUESTION, extra_body=extra)
    second_prompt = engine.tokenizer.decode(engine.prompts[1])
    assert "</tool_call><|im_end|>" + between_turns + "<|im_start|>user\n<tool_response>" in second_prompt


def test_an_unknown_tool_protocol_is_a_400_naming_the_choices(make_server):
    client, _, engine, _ = make_server()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"tool_protocol": "paper"})
    assert err.value.body["param"] == "tool_protocol" and "released" in err.value.body["message"]
    assert engine.prompts == []
