"""How samples are generated: the HTTP client against the API contract (mock transport), the in-process
client on a scripted engine and the real tokenizer, and the BFCL multi-turn loop on bfcl-eval's simulators."""

from __future__ import annotations

import ast
import asyncio
import json
from dataclasses import replace

import httpx
import pytest
from evals_data import shared_data_dir
from scripted_engine import ScriptedEngine
from scripted_sandbox import ScriptedSandbox

from rstar.evals import NATIVE_TEMPLATE, RSTAR_TEMPLATE, Prompt, get_benchmark
from rstar.evals.client import (
    Completion,
    FatalRequestError,
    GenerationParams,
    HttpChatClient,
    InProcessChatClient,
    chat_completions_url,
    generate,
)
from rstar.server.model_store import model_sampling_defaults
from rstar.server.schemas import CodeCell
from rstar.server.trajectory import Trajectory

RSTAR = GenerationParams(model="m", template=RSTAR_TEMPLATE, temperature=0.6, top_p=0.95, max_tokens=256, max_turns=5, seed=7)
NATIVE = GenerationParams(model="m", template=NATIVE_TEMPLATE, temperature=0.0, top_p=1.0, max_tokens=256, max_turns=3)
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def answer(message: dict, usage: dict | None = None, finish: str = "stop") -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}], "usage": usage or {"prompt_tokens": 11, "completion_tokens": 5}}


def mock_client(handler, **kwargs) -> HttpChatClient:
    client = HttpChatClient("http://server:8000/v1", api_key="k", backoff_s=0.0, **kwargs)
    client.http = httpx.AsyncClient(transport=httpx.MockTransport(handler), headers=client.http.headers)
    return client


def test_endpoint_forms_all_reach_chat_completions():
    want = "http://h:1/v1/chat/completions"
    assert {chat_completions_url(u) for u in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/chat/completions")} == {want}


def test_rstar_template_asks_the_server_to_run_its_tool_loop():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((json.loads(request.content), request.headers["authorization"]))
        cells = [{"index": 0, "name": "python_code_with_standard_io", "code": "print(2)", "status": "ok", "stdout": "2\n", "stderr": "", "duration_s": 0.1}]
        return httpx.Response(200, json=answer({"content": "<answer>\\boxed{2}</answer>", "reasoning_content": "think", "code_cells": cells}))

    client = mock_client(handler)
    sample = asyncio.run(generate(client, Prompt(messages=[{"role": "user", "content": "1+1?"}]), RSTAR))
    body, auth = seen[0]
    assert auth == "Bearer k"
    assert (body["builtin_tools"], body["max_turns"], body["seed"], body["top_p"], body["max_tokens"]) == (True, 5, 7, 0.95, 256)
    assert body["chat_template"] == "rstar"
    assert "tools" not in body and "frequency_penalty" not in body and "repetition_penalty" not in body  # left to the served model: not sent
    assert sample.response == "<answer>\\boxed{2}</answer>"
    assert (sample.num_turns, sample.num_tool_calls, sample.prompt_tokens, sample.completion_tokens) == (2, 1, 11, 5)
    # stored in the Trajectory shape readers (the UI) know, the response kept whole
    trajectory = sample.trajectory
    assert [(turn["text"], turn["finish_reason"]) for turn in trajectory["turns"]] == [("<reason>think</reason><answer>\\boxed{2}</answer>", "stop")]
    assert (trajectory["tool_calls"][0]["exec_status"], trajectory["tool_calls"][0]["stdout"], trajectory["tool_calls"][0]["arguments"]) == ("ok", "2\n", {"code": "print(2)"})
    assert trajectory["response"]["usage"]["prompt_tokens"] == 11


def test_penalties_reach_the_server_and_the_in_process_engine(default_tokenizer):
    penalised = replace(RSTAR, frequency_penalty=0.4, repetition_penalty=1.1)
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=answer({"content": "<answer>\\boxed{2}</answer>"}))

    asyncio.run(generate(mock_client(handler), Prompt(messages=[{"role": "user", "content": "1+1?"}]), penalised))
    assert (seen[0]["frequency_penalty"], seen[0]["repetition_penalty"]) == (0.4, 1.1)
    engine = ScriptedEngine(default_tokenizer, ["It is 2.</reason>\n<answer>\\boxed{2}</answer>"])
    asyncio.run(InProcessChatClient(engine, ScriptedSandbox().executor()).complete([{"role": "user", "content": "1+1?"}], None, penalised))
    assert (engine.sampling[0].frequency_penalty, engine.sampling[0].repetition_penalty) == (0.4, 1.1)


def test_a_penalty_given_as_off_is_sent_and_one_left_out_is_the_models_in_process(default_tokenizer):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=answer({"content": "<answer>\\boxed{2}</answer>"}))

    off = replace(RSTAR, frequency_penalty=0.0, repetition_penalty=1.0)
    asyncio.run(generate(mock_client(handler), Prompt(messages=[{"role": "user", "content": "1+1?"}]), off))
    assert (seen[0]["frequency_penalty"], seen[0]["repetition_penalty"]) == (0.0, 1.0)  # over a server default
    # In process, a penalty left out is what `rstar serve` would sample that model with.
    for model_name, params, expected in [("default", RSTAR, model_sampling_defaults("default")["frequency_penalty"]), ("default", off, 0.0), ("scripted", RSTAR, 0.0)]:
        engine = ScriptedEngine(default_tokenizer, ["It is 2.</reason>\n<answer>\\boxed{2}</answer>"], model_name=model_name)
        asyncio.run(InProcessChatClient(engine, ScriptedSandbox().executor()).complete([{"role": "user", "content": "1+1?"}], None, params))
        assert (engine.sampling[0].frequency_penalty, engine.sampling[0].repetition_penalty) == (expected, 1.0), model_name
    assert model_sampling_defaults("default")["frequency_penalty"] > 0


def test_native_template_declares_client_tools_and_returns_the_calls():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        calls = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
        return httpx.Response(200, json=answer({"content": None, "tool_calls": calls}, finish="tool_calls"))

    sample = asyncio.run(generate(mock_client(handler), Prompt(messages=[{"role": "user", "content": "weather?"}], tools=WEATHER), NATIVE))
    assert seen[0]["builtin_tools"] is False and seen[0]["tools"] == WEATHER and "max_turns" not in seen[0]
    assert seen[0]["chat_template"] == "model"  # the benchmark's own prompt: the model's template, never the rStar one
    assert sample.response == [{"id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert sample.num_tool_calls == 1 and sample.num_turns == 1


def test_transient_failures_are_retried_and_a_wrong_request_stops_the_run():
    replies = iter([httpx.Response(503, text="busy"), httpx.Response(429, text="slow down"), httpx.Response(200, json=answer({"content": "ok"}))])
    client = mock_client(lambda request: next(replies))
    assert asyncio.run(client.complete([{"role": "user", "content": "x"}], None, NATIVE)).content == "ok"

    refused = mock_client(lambda request: httpx.Response(404, json={"error": {"message": "The model `m` does not exist", "code": "model_not_found"}}))
    with pytest.raises(FatalRequestError, match="404.*does not exist"):
        asyncio.run(refused.complete([{"role": "user", "content": "x"}], None, NATIVE))

    always_down = mock_client(lambda request: httpx.Response(502, text="down"), retries=1)
    with pytest.raises(httpx.HTTPStatusError):
        asyncio.run(always_down.complete([{"role": "user", "content": "x"}], None, NATIVE))


def test_a_prompt_over_the_context_window_is_a_scored_empty_answer_not_a_failure():
    too_long = {"error": {"message": "maximum context length is 4096", "type": "invalid_request_error", "code": "context_length_exceeded"}}
    client = mock_client(lambda request: httpx.Response(400, json=too_long))
    sample = asyncio.run(generate(client, Prompt(messages=[{"role": "user", "content": "x"}]), NATIVE))
    assert sample.response == "" and sample.errors == ["context_length_exceeded"]


def test_in_process_rstar_answer_runs_the_tool_loop(default_tokenizer):
    tool_turn = 'Let me compute.\n<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(2+2)", "input": ""}}\n</tool_call>'
    engine = ScriptedEngine(default_tokenizer, [tool_turn, "It is 4.</reason>\n<answer>\\boxed{4}</answer>"])
    client = InProcessChatClient(engine, ScriptedSandbox(outputs={"print(2+2)": "4\n"}).executor())
    completion = asyncio.run(client.complete([{"role": "user", "content": "2+2?"}], None, RSTAR))
    assert completion.content.endswith("<answer>\\boxed{4}</answer>")
    assert (completion.turns, completion.code_calls, completion.tool_calls) == (2, 1, [])
    assert completion.trajectory["tool_calls"][0]["stdout"] == "4\n" and completion.trajectory["prompt_ids"]
    # the rStar template (its answer instruction) was used, and the python tool was listed
    prompt = default_tokenizer.decode(engine.prompts[0])
    assert "You must put your answer inside <answer> </answer> tags" in prompt and "python_code_with_standard_io" in prompt
    sampled = sum(len(default_tokenizer.encode(t, add_special_tokens=False)) for t in (tool_turn, "It is 4.</reason>\n<answer>\\boxed{4}</answer>"))
    # the model's tokens, each turn's sampled <|im_end|> included; the tool turn's are not counted
    assert completion.completion_tokens == sampled + 2


def test_in_process_client_tools_come_back_as_calls(default_tokenizer):
    reply = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    engine = ScriptedEngine(default_tokenizer, [reply])
    completion = asyncio.run(InProcessChatClient(engine, ScriptedSandbox(outputs={"print(2+2)": "4\n"}).executor()).complete([{"role": "user", "content": "weather?"}], WEATHER, NATIVE))
    # every call of the turn, not only the first (BFCL's parallel categories need all of them)
    assert completion.tool_calls == [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]
    assert completion.content == "Checking."
    assert len(engine.prompts) == 1  # the client runs its own tools: the loop stopped at the calls
    prompt = default_tokenizer.decode(engine.prompts[0])
    assert "You must put your answer" not in prompt and "get_weather" in prompt


def test_in_process_client_can_drive_an_engine_on_another_loop(default_tokenizer, loop_thread):
    engine = ScriptedEngine(default_tokenizer, ["plain answer"])
    client = InProcessChatClient(engine, ScriptedSandbox(outputs={"print(2+2)": "4\n"}).executor(), loop=loop_thread.loop)
    assert asyncio.run(client.complete([{"role": "user", "content": "hi"}], None, NATIVE)).content == "plain answer"


# --------------------------------------------------------------------------------- BFCL multi-turn loop


def parse_call(text: str, functions: list[dict]) -> dict:
    """'cd(folder="x")' or 'sort("f")' -> {"name", "arguments"}; positional arguments follow the doc's order."""
    node = ast.parse(text, mode="eval").body
    name = node.func.id
    order = next(list(f["parameters"]["properties"]) for f in functions if f["name"] == name)
    arguments = {order[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
    arguments.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
    return {"name": name, "arguments": json.dumps(arguments)}


class GroundTruthClient:
    """Answers each user turn with its ground-truth calls in one step, then with text."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.functions = doc["function"] + [f for fns in doc["missed_function"].values() for f in fns]
        self.tool_counts: list[int] = []

    async def complete(self, messages, tools, params) -> Completion:
        self.tool_counts.append(len(tools))
        turn = sum(m["role"] == "user" for m in messages) - 1
        calls = [] if messages[-1]["role"] == "tool" else [parse_call(c, self.functions) for c in self.doc["ground_truth"][turn]]
        turns = [{"text": "" if calls else "Done."}]
        return Completion("" if calls else "Done.", calls, 10, 3, 1, 0, "stop", {"turns": turns, "tool_calls": [{"turn": 0, "name": c["name"]} for c in calls]})


@pytest.fixture(scope="module")
def multi_turn_docs():
    from rstar.evals.bfcl import load

    return load(shared_data_dir(), ("multi_turn_base", "multi_turn_miss_func"))


@pytest.mark.parametrize("doc_id", ["multi_turn_base_0", "multi_turn_miss_func_0"])
def test_multi_turn_ground_truth_played_through_the_loop_passes_the_checker(multi_turn_docs, doc_id):
    bench = get_benchmark("bfcl_v3")
    doc = next(d for d in multi_turn_docs if d["id"] == doc_id)
    client = GroundTruthClient(doc)
    sample = asyncio.run(generate(client, bench.build_prompt(doc, 0), NATIVE, bench.environment(doc)))
    assert len(sample.response) == len(doc["ground_truth"])
    # one trajectory per request, and their turns and calls in order at the top
    requests = sample.trajectory["requests"]
    assert len(requests) == len(client.tool_counts) == len(sample.trajectory["turns"])
    assert [c["turn"] for c in sample.trajectory["tool_calls"]] == sorted(c["turn"] for c in sample.trajectory["tool_calls"])
    assert len(sample.trajectory["tool_calls"]) == sum(len(calls) for calls in doc["ground_truth"]) == sample.num_tool_calls
    assert bench.grade(doc, sample.response, 0).score == 1.0
    if doc["missed_function"]:  # the held-out docs are offered from their turn on, not before
        assert max(client.tool_counts) > min(client.tool_counts)
    # a wrong answer in one turn fails the entry
    broken = [steps if i != 1 else [] for i, steps in enumerate(sample.response)]
    assert bench.grade(doc, broken, 0).score == 0.0


def test_a_turn_that_never_stops_calling_ends_the_entry(multi_turn_docs):
    bench = get_benchmark("bfcl_v3")
    doc = next(d for d in multi_turn_docs if d["id"] == "multi_turn_base_0")

    class Looping(GroundTruthClient):
        async def complete(self, messages, tools, params):
            return Completion("", [{"name": "pwd", "arguments": "{}"}], 10, 3, 1, 0, "tool_calls", {})

    sample = asyncio.run(generate(Looping(doc), bench.build_prompt(doc, 0), NATIVE, bench.environment(doc)))
    assert len(sample.response) == 1 and len(sample.response[0]) == NATIVE.max_turns  # bfcl-eval's force-termination
    assert bench.grade(doc, sample.response, 0).details["error_type"] == "multi_turn:force_terminated"


@pytest.mark.parametrize("tool_timeout", [None, 2.5])
def test_in_process_tool_timeout_reaches_the_sandbox(default_tokenizer, tool_timeout):
    from dataclasses import replace

    tool_turn = '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "print(2+2)", "input": ""}}\n</tool_call>'
    engine = ScriptedEngine(default_tokenizer, [tool_turn, "It is 4.</reason>\n<answer>\\boxed{4}</answer>"])
    sandbox = ScriptedSandbox(outputs={"print(2+2)": "4\n"})
    client = InProcessChatClient(engine, sandbox.executor())
    completion = asyncio.run(client.complete([{"role": "user", "content": "2+2?"}], None, replace(RSTAR, tool_timeout=tool_timeout)))
    assert completion.code_calls == 1 and [request.timeout_s for request in sandbox.requests] == [tool_timeout]


def test_a_chat_response_reads_back_as_the_records_its_cells_were_rendered_from():
    cells = [
        {"index": 0, "name": "python_code_with_standard_io", "code": "1/0", "status": "error", "stdout": "", "stderr": "ZeroDivisionError", "duration_s": 0.02,
         "images": ["data:image/png;base64,iVBORw0KGgo="], "image_notes": ["figure 2 not returned: at most 1 per cell (max_images_per_cell)"]},
        {"index": 1, "name": "", "code": "{oops", "status": "invalid_input", "stdout": "", "stderr": "Failed to decode tool call: bad JSON", "duration_s": None,
         "images": [], "image_notes": []},
    ]
    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    response = answer({"content": "", "reasoning_content": "r", "code_cells": cells, "tool_calls": calls}, finish="tool_calls")
    trajectory = Trajectory.from_chat_response({**response, "tool_protocol": "improved"})
    client_call = trajectory.tool_calls[2]
    # stored, the records draw as the very cells the server sent (the UI's drill-down shows those)
    assert [CodeCell.of_record(record).model_dump() for record in trajectory.tool_calls[:2]] == cells
    assert CodeCell.of_record(trajectory.tool_calls[2]) is None
    assert (client_call.index, client_call.name, client_call.arguments, client_call.response) == (2, "get_weather", '{"city": "Oslo"}', None)
    assert (trajectory.turns[0].text, trajectory.stop_reason, trajectory.tool_protocol) == ("<reason>r</reason>", "tool_calls", "improved")
