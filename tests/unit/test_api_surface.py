"""The rest of the API on a scripted engine: limits (413, 429, 504, disconnects), conversations and the
trajectory export, /v1/completions, tokenize, /v1/responses, metrics, health and version."""

from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest

from rstar.asgi import ClientDisconnected, cancel_on_disconnect
from rstar.config import SettingsInvalid, load_settings
from rstar.server.model_store import model_sampling_defaults
from tests.scripted_engine import call
from tests.unit.api_server import QUESTION, REPLY, TOOL_TURNS, make_server, sandbox_of  # noqa: F401 (fixture)

# -- limits -------------------------------------------------------------------------------------------


def test_oversized_body_is_413_in_openai_shape(make_server):
    _, http, engine, _ = make_server(api={"max_body_bytes": 2000})
    big = {"model": "scripted", "messages": [{"role": "user", "content": "x" * 5000}]}
    response = http.post("/v1/chat/completions", json=big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"
    chunked = http.post("/v1/chat/completions", content=iter([json.dumps(big).encode()]), headers={"content-type": "application/json"})
    assert chunked.status_code == 413  # no Content-Length: counted while reading
    assert engine.prompts == []


def test_full_admission_queue_is_429_with_retry_after(make_server):
    client, http, engine, _ = make_server(replies=("slow " * 40,), api={"max_running_requests": 1, "max_waiting_requests": 0, "retry_after_s": 3})
    engine.token_delay_s = 0.05
    stream = client.chat.completions.create(model="scripted", messages=QUESTION, stream=True)
    next(iter(stream))  # holds the only running slot
    response = http.post("/v1/chat/completions", json={"model": "scripted", "messages": QUESTION})
    assert response.status_code == 429 and response.headers["retry-after"] == "3"
    assert response.json()["error"]["type"] == "rate_limit_error"
    stream.close()


def test_waiting_request_gets_429_after_the_queue_timeout(make_server):
    client, http, engine, _ = make_server(replies=("slow " * 60,), api={"max_running_requests": 1, "max_waiting_requests": 4, "queue_timeout_s": 0.3})
    engine.token_delay_s = 0.05
    stream = client.chat.completions.create(model="scripted", messages=QUESTION, stream=True)
    next(iter(stream))
    started = time.monotonic()
    response = http.post("/v1/chat/completions", json={"model": "scripted", "messages": QUESTION})
    assert response.status_code == 429 and time.monotonic() - started >= 0.3
    stream.close()


def test_request_timeout_is_504_and_aborts(make_server):
    client, http, engine, _ = make_server(replies=("slow " * 100,), api={"request_timeout_s": 0.3})
    engine.token_delay_s = 0.02
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="scripted", messages=QUESTION)
    assert err.value.status_code == 504 and err.value.body["code"] == "timeout"
    assert len(engine.aborted) == 1 and engine.stats().unfinished == 0
    with http.stream("POST", "/v1/chat/completions", json={"model": "scripted", "messages": QUESTION, "stream": True}) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert "did not finish within 0.3 s" in json.loads(events[-1])["error"]["message"]
    assert len(engine.aborted) == 2


def test_a_client_that_leaves_cancels_a_non_streaming_request():
    async def main():
        cancelled = asyncio.Event()

        async def work():
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async def receive():
            await asyncio.sleep(0.05)
            return {"type": "http.disconnect"}

        with pytest.raises(ClientDisconnected):
            await cancel_on_disconnect(receive, work())
        return cancelled.is_set()

    assert asyncio.run(main())


def test_invalid_tools_and_messages_are_400(make_server):
    client, _, _, _ = make_server()
    with pytest.raises(openai.BadRequestError, match="not among tools"):
        client.chat.completions.create(model="scripted", messages=QUESTION, tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="last message to be from the assistant"):
        client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"continue_final_message": True})
    with pytest.raises(openai.BadRequestError, match="only with continue_final_message"):
        client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"add_generation_prompt": False})
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"max_turns": 0})
    assert err.value.body["param"] == "max_turns"


# -- conversations --------------------------------------------------------------------------------------


def test_conversations_are_listed_fetched_continued_exported_and_deleted(make_server):
    client, http, _, _ = make_server(replies=(*TOOL_TURNS, "Second answer."))
    sandbox_of(http).outputs["print(6*7)"] = "42\n"
    first = client.chat.completions.create(model="scripted", messages=QUESTION, logprobs=True)
    conversation_id = first.conversation_id
    other = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "newer"}])
    listed = http.get("/v1/conversations").json()
    assert listed["object"] == "list"
    assert [c["id"] for c in listed["data"]] == [other.conversation_id, conversation_id]  # newest first
    assert http.get("/v1/conversations", params={"limit": 1, "offset": 1}).json()["data"][0]["title"] == "What is 6*7?"

    stored = http.get(f"/v1/conversations/{conversation_id}").json()
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant"]
    reply = stored["messages"][1]
    assert reply["reasoning_content"] == "Let me compute.The tool says 42." and reply["code_cells"][0]["stdout"] == "42\n"

    history = [*QUESTION, {"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "And 7*8?"}]
    follow = client.chat.completions.create(model="scripted", messages=history, extra_body={"conversation_id": conversation_id})
    assert follow.conversation_id == conversation_id
    messages = http.get(f"/v1/conversations/{conversation_id}").json()["messages"]
    assert [m["content"] for m in messages][-2:] == ["And 7*8?", "Second answer."] and len(messages) == 4

    lines = [json.loads(line) for line in http.get("/v1/conversations/export.jsonl").text.splitlines()]
    mine = [line for line in lines if line["conversation_id"] == conversation_id]
    assert len(mine) == 2 and len(lines) == 3
    with_tool = mine[0]
    assert with_tool["tool_calls"][0]["stdout"] == "42\n" and 0 in with_tool["response_mask"] and 1 in with_tool["response_mask"]
    assert len(with_tool["response_ids"]) == len(with_tool["response_mask"]) == len(with_tool["logprobs"])
    assert with_tool["messages"] == QUESTION
    assert mine[1]["logprobs"] is None  # computed only when the request asks for them
    assert 0 < with_tool["timings"]["time_to_first_token_s"] <= with_tool["timings"]["duration_s"]
    assert with_tool["tool_calls"][0]["wall_s"] >= 0 and with_tool["tool_calls"][0]["started_at"] > 0

    assert http.delete(f"/v1/conversations/{conversation_id}").json()["deleted"] is True
    missing = http.get(f"/v1/conversations/{conversation_id}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "conversation_not_found"
    assert http.delete(f"/v1/conversations/{conversation_id}").status_code == 404
    assert len(http.get("/v1/conversations/export.jsonl").text.splitlines()) == 1


def test_unknown_conversation_id_in_a_request_is_404(make_server):
    client, _, engine, _ = make_server()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"conversation_id": "nope"})
    assert engine.prompts == []


# -- completions and tokens ----------------------------------------------------------------------------


def test_completions_from_text_and_token_ids(make_server):
    client, _, engine, _ = make_server()
    completion = client.completions.create(model="scripted", prompt="2+2=", max_tokens=50, logprobs=1)
    assert completion.choices[0].text == REPLY and completion.choices[0].finish_reason == "stop"
    assert "".join(completion.choices[0].logprobs.tokens) == REPLY + "<|im_end|>"  # the sampled turn end has a logprob too
    assert engine.prompts[0] == engine.tokenizer.encode("2+2=")
    client.completions.create(model="scripted", prompt=[1, 2, 3], max_tokens=5)
    assert engine.prompts[1] == [1, 2, 3]
    chunks = list(client.completions.create(model="scripted", prompt="hi", max_tokens=50, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == REPLY
    assert chunks[-1].usage.completion_tokens == len(engine.tokenizer.encode(REPLY)) + 1  # the sampled turn end counts


def test_tokenize_and_detokenize_round_trip(make_server):
    _, http, engine, _ = make_server()
    tokens = http.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert tokens["tokens"] == engine.tokenizer.encode("Hello world") and tokens["count"] == len(tokens["tokens"])
    assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"] == "Hello world"
    chat = http.post("/tokenize", json={"messages": QUESTION}).json()
    assert "What is 6*7?" in engine.tokenizer.decode(chat["tokens"])
    assert http.post("/detokenize", json={"tokens": [10**9]}).status_code == 400


def test_tokenize_renders_the_prompt_a_chat_request_with_the_same_body_sends(make_server):
    _, http, engine, _ = make_server()
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    bodies = [
        {"messages": QUESTION},
        {"messages": QUESTION, "tools": [weather]},
        {"messages": QUESTION, "tools": [weather], "builtin_tools": False, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"messages": QUESTION, "tools": [weather], "tool_choice": "none", "chat_template": "rstar"},
        {"messages": QUESTION, "chat_template": "rstar", "chat_template_kwargs": {"math_instruction": False}},
        {"messages": [*QUESTION, {"role": "assistant", "content": "Let me see"}], "continue_final_message": True, "add_generation_prompt": False},
    ]
    rendered = []
    for body in bodies:
        chat = http.post("/v1/chat/completions", json={"model": "scripted", **body, "max_tokens": 1, "return_token_ids": True})
        tokens = http.post("/tokenize", json={"model": "scripted", **body})
        assert chat.status_code == tokens.status_code == 200, (chat.text, tokens.text)
        assert tokens.json()["tokens"] == chat.json()["prompt_token_ids"], body
        rendered.append(engine.tokenizer.decode(tokens.json()["tokens"]))
    assert len(set(rendered)) == len(bodies)  # every field above changes the prompt
    assert "get_weather" in rendered[1] and "python_code_with_standard_io" in rendered[1]
    refused = http.post("/tokenize", json={"messages": QUESTION, "tools": [weather, weather]})
    assert refused.status_code == 400 and "unique" in refused.json()["error"]["message"]


def test_each_endpoint_hands_its_sampling_fields_to_the_engine(make_server):
    _, http, engine, _ = make_server()
    knobs = {"temperature": 0.6, "top_p": 0.9, "top_k": -1, "seed": 5, "presence_penalty": 0.2, "frequency_penalty": 0.3, "repetition_penalty": 1.1}
    assert http.post("/v1/chat/completions", json={"model": "scripted", "messages": QUESTION, "n": 2, "stop": "END", **knobs}).status_code == 200
    assert http.post("/v1/responses", json={"model": "scripted", "input": "hi", **knobs, "top_k": 3}).status_code == 200
    completion = {"model": "scripted", "prompt": "hi", "max_tokens": 4, "stop": ["a", "b"], "stop_token_ids": [7], "logprobs": 2, "ignore_eos": True}
    assert http.post("/v1/completions", json=completion | knobs).status_code == 200
    seen = [(o.temperature, o.top_p, o.top_k, o.seed, o.stop, o.logprobs, o.ignore_eos) for o in engine.sampling]
    assert seen == [
        (0.6, 0.9, 0, 5, ("END",), None, False),  # choice 0; a top_k of -1 is off, as 0 is
        (0.6, 0.9, 0, 6, ("END",), None, False),  # choice 1 samples with seed + 1
        (0.6, 0.9, 3, 5, (), None, False),
        (0.6, 0.9, 0, 5, ("a", "b"), 2, True),
    ]
    assert (engine.sampling[-1].max_tokens, engine.sampling[-1].stop_token_ids) == (4, (7,))
    assert {(o.presence_penalty, o.frequency_penalty, o.repetition_penalty) for o in engine.sampling} == {(0.2, 0.3, 1.1)}


def test_a_penalty_left_out_is_the_models_recommended_one_and_a_sent_one_wins(make_server):
    _, http, engine, _ = make_server(model_name="default")  # the embedded default model recommends a frequency penalty
    recommended = model_sampling_defaults("default")
    assert recommended["frequency_penalty"] > 0
    assert http.get("/v1/models").json()["data"][0]["sampling_defaults"] == recommended
    for body in ({"model": "default", "messages": QUESTION}, {"model": "default", "input": "hi"}, {"model": "default", "prompt": "hi", "max_tokens": 2}):
        path = "/v1/chat/completions" if "messages" in body else "/v1/responses" if "input" in body else "/v1/completions"
        assert http.post(path, json=body).status_code == 200
        assert http.post(path, json=body | {"frequency_penalty": 0, "repetition_penalty": 1.05}).status_code == 200
    assert [(o.frequency_penalty, o.repetition_penalty) for o in engine.sampling] == [(recommended["frequency_penalty"], 1.0), (0.0, 1.05)] * 3


def test_the_operator_sets_the_penalty_defaults_or_turns_them_off(make_server):
    _, http, engine, _ = make_server(model_name="default", api={"sampling_defaults": {}})
    assert http.get("/v1/models").json()["data"][0]["sampling_defaults"] == {}
    assert http.post("/v1/chat/completions", json={"model": "default", "messages": QUESTION}).status_code == 200
    _, other, other_engine, _ = make_server(api={"sampling_defaults": {"repetition_penalty": 1.2}})
    assert other.get("/v1/models").json()["data"][0]["sampling_defaults"] == {"repetition_penalty": 1.2}
    assert other.post("/v1/chat/completions", json={"model": "scripted", "messages": QUESTION}).status_code == 200
    assert [(o.frequency_penalty, o.repetition_penalty) for o in engine.sampling + other_engine.sampling] == [(0.0, 1.0), (0.0, 1.2)]


@pytest.mark.parametrize("defaults", [{"frequency_penalty": 2.5}, {"repetition_penalty": 0}, {"top_k": 3}])
def test_penalty_defaults_outside_the_request_ranges_are_refused_at_start(defaults):
    with pytest.raises(SettingsInvalid, match="sampling_defaults"):
        load_settings(api={"sampling_defaults": defaults})


@pytest.mark.parametrize("field, value", [("frequency_penalty", 2.5), ("presence_penalty", -3), ("repetition_penalty", 0), ("repetition_penalty", 3)])
def test_a_penalty_out_of_its_range_is_a_400_naming_it(make_server, field, value):
    # OpenAI's range for the two OpenAI penalties; vLLM's repetition penalty divides a logit, so it must be positive,
    # and past 2 it stops a model from repeating even the question's numbers.
    _, http, engine, _ = make_server()
    reply = http.post("/v1/chat/completions", json={"model": "scripted", "messages": QUESTION, field: value})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == field, reply.text
    assert engine.sampling == []


def test_token_ids_outside_the_vocabulary_are_the_clients_error(make_server):
    _, http, engine, _ = make_server()
    vocabulary = len(engine.tokenizer)
    for prompt in ([1, vocabulary], [-1]):
        reply = http.post("/v1/completions", json={"model": "scripted", "prompt": prompt, "max_tokens": 5})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "prompt" and str(prompt[-1]) in reply.json()["error"]["message"]
    assert engine.prompts == []  # refused before the engine saw it


# -- responses ------------------------------------------------------------------------------------------

CODE_TOOL = [{"type": "code_interpreter", "container": {"type": "auto"}}]


def test_responses_show_code_interpreter_calls(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS)
    sandbox_of(http).outputs["print(6*7)"] = "42\n"
    response = client.responses.create(model="scripted", input="What is 6*7?", tools=CODE_TOOL)
    assert [item.type for item in response.output] == ["reasoning", "message", "code_interpreter_call", "reasoning", "message"]
    cell = response.output[2]
    assert cell.code == "print(6*7)" and cell.status == "completed" and cell.outputs[0].logs == "42\n"
    assert response.output_text.strip() == "The answer is 42."
    assert response.status == "completed" and response.usage.output_tokens > 0


def test_responses_stream_code_interpreter_events_in_order(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS)
    sandbox_of(http).outputs["print(6*7)"] = "42\n"
    events = list(client.responses.create(model="scripted", input="What is 6*7?", tools=CODE_TOOL, stream=True))
    kinds = [e.type for e in events if "code_interpreter" in e.type]
    assert kinds == [
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed",
    ]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip().endswith("The answer is 42.")


def test_responses_without_code_interpreter_run_no_code(make_server):
    client, http, engine, _ = make_server(replies=(call("print(1)"),))
    response = client.responses.create(model="scripted", input="hi")
    assert sandbox_of(http).requests == [] and "<tools>" not in engine.tokenizer.decode(engine.prompts[0])
    assert response.output_text == call("print(1)")


def test_responses_function_tools_come_back_as_function_calls(make_server):
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    client, _, _, _ = make_server(replies=(reply,))
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    response = client.responses.create(model="scripted", input="Weather in Paris?", tools=[tool])
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


# -- metrics, health, version ---------------------------------------------------------------------------


def test_metrics_count_requests_tokens_and_tool_calls(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS)
    client.chat.completions.create(model="scripted", messages=QUESTION)
    http.post("/v1/chat/completions", json={"model": "nope", "messages": QUESTION})
    text = http.get("/metrics").text
    assert 'rstar_tool_calls_total{status="ok",tool="python_code_with_standard_io"} 1.0' in text
    assert 'rstar_requests_total{route="/v1/chat/completions",status="200"} 1.0' in text
    assert 'rstar_requests_total{route="/v1/chat/completions",status="404"} 1.0' in text
    assert "rstar_time_to_first_token_seconds_count 1.0" in text
    assert "rstar_sandbox_failures_total 0.0" in text
    assert "rstar_engine_prefix_cache_hit_rate 0.0" in text  # the scripted engine looks nothing up


def test_prefix_cache_hit_rate_is_hits_over_queries():
    from rstar.server.engine import EngineStats
    from rstar.server.metrics import prefix_cache_hit_rate

    assert prefix_cache_hit_rate(EngineStats(0, 0, 0, 0.0, prefix_cache_queries=400, prefix_cache_hits=304)) == 0.76
    assert prefix_cache_hit_rate(EngineStats(0, 0, 0, 0.0)) == 0.0


def test_sandbox_failures_are_counted(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS)
    sandbox_of(http).status = "internal_error"
    client.chat.completions.create(model="scripted", messages=QUESTION)
    assert "rstar_sandbox_failures_total 1.0" in http.get("/metrics").text


def test_health_reports_the_sandbox_and_version_answers(make_server):
    _, http, _, _ = make_server()
    health = http.get("/health").json()
    assert health["sandbox"] == {"status": "ok", "scripted": True} and health["status"] == "ok"
    sandbox_of(http).closed = True
    assert http.get("/health").json()["status"] == "degraded"
    assert http.get("/version").json()["version"]


def test_a_dead_engine_makes_health_and_requests_503(make_server, monkeypatch):
    """After vLLM's EngineCore died (a worker OOM-killed), it refuses every request: /health must say so with
    a 503, so an orchestrator restarts the process, and requests get a 503 naming the cause, not a 500."""
    from rstar.server.engine import EngineFailed, EngineStats

    client, http, engine, _ = make_server()
    why = "the engine died (EngineDeadError: EngineCore encountered an issue); restart the server"

    async def dead(*args, **kwargs):
        raise EngineFailed(why)
        yield  # an async generator, like the real one

    monkeypatch.setattr(engine, "generate", dead)
    monkeypatch.setattr(engine, "stats", lambda: EngineStats(0, 0, 0, 0.0, failed=why))
    health = http.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "failed" and health.json()["engine"]["failed"] == why
    reply = http.post("/v1/chat/completions", json={"model": "scripted", "messages": QUESTION})
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "engine_unavailable" and why in reply.json()["error"]["message"]
    with http.stream("POST", "/v1/completions", json={"model": "scripted", "prompt": "hi", "max_tokens": 4, "stream": True}) as stream:
        body = "".join(stream.iter_text())
    assert "engine unavailable" in body and "503" in body  # an SSE error event once the stream began


def test_a_stream_that_never_started_still_gives_back_its_slots():
    from rstar.server.limits import Admission, AdmittedStream

    async def main():
        admission = Admission(max_running=2, max_waiting=0, wait_timeout_s=1, retry_after_s=1)

        async def events():
            yield "data: never sent\n\n"

        await admission.acquire(2)
        stream = AdmittedStream(admission, 2, events())
        await stream.aclose()  # the response closed it before the first event (client already gone)
        await stream.aclose()  # and closing twice gives back nothing twice
        return admission.running

    assert asyncio.run(main()) == 0
