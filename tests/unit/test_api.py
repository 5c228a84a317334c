"""The OpenAI API on a scripted engine, driven by the official openai client."""

from __future__ import annotations

import json
import time

import openai
import pytest
from sqlalchemy import select

from rstar.server.db import Conversation, open_database
from tests.unit.api_server import REPLY, make_server  # noqa: F401 (fixture)


def test_health_and_models(make_server):
    client, http, _, _ = make_server()
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["engine"]["unfinished"] == 0
    assert [m.id for m in client.models.list().data] == ["scripted"]


def test_chat_completion_returns_the_generation_with_usage(make_server):
    client, _, engine, _ = make_server()
    completion = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "What is 2+2?"}])
    assert completion.choices[0].message.content == REPLY
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.prompt_tokens == len(engine.prompts[0])
    # The sampled turn end counts, as vLLM counts a sampled end-of-sequence token; its text is not shown.
    assert completion.usage.completion_tokens == len(engine.tokenizer.encode(REPLY)) + 1
    # The prompt is the model's own chat template around the user's message.
    assert "What is 2+2?" in engine.tokenizer.decode(engine.prompts[0])


def test_max_tokens_cuts_with_finish_reason_length(make_server):
    client, _, _, _ = make_server()
    completion = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=3)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 3


def test_streaming_yields_deltas_that_add_up_and_usage_last(make_server):
    client, _, _, _ = make_server()
    stream = client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "hi"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == REPLY
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 1


def test_n_choices_each_get_their_own_generation(make_server):
    client, _, engine, _ = make_server(replies=("first answer", "second answer"))
    completion = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], n=2)
    assert sorted(c.message.content for c in completion.choices) == ["first answer", "second answer"]
    assert [c.index for c in completion.choices] == [0, 1]
    assert len(engine.prompts) == 2


def test_logprobs_come_back_per_token(make_server):
    client, _, _, _ = make_server()
    completion = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=1)
    entries = completion.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == REPLY + "<|im_end|>"  # every sampled token, the turn end too
    assert all(e.logprob == -0.5 and len(e.top_logprobs) == 1 for e in entries)


def test_unknown_model_is_404_in_openai_shape(make_server):
    client, _, _, _ = make_server()
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["code"] == "model_not_found"
    assert "gpt-9" in err.value.body["message"]


def test_invalid_parameter_is_400_naming_it(make_server):
    client, _, _, _ = make_server()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], temperature=7)
    assert err.value.body["param"] == "temperature"
    assert err.value.body["type"] == "invalid_request_error"


def test_context_overflow_is_400(make_server):
    client, _, engine, _ = make_server()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], max_tokens=10_000)
    assert "maximum context length is 1024 tokens" in err.value.body["message"]
    assert err.value.body["code"] == "context_length_exceeded"
    assert engine.prompts == []  # nothing reached the engine


def test_api_key_is_required_when_configured(make_server):
    client, http, _, _ = make_server(api_key="sekrit")
    assert client.models.list().data  # the client sends the right key
    wrong = openai.OpenAI(base_url="http://localhost/v1", api_key="wrong", http_client=http, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert http.post("/v1/chat/completions", json={}).status_code == 401
    assert http.get("/health").status_code == 200  # probes stay open


def test_exchange_is_stored_unless_opted_out(make_server):
    client, _, _, settings = make_server()
    client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "keep me"}])
    client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "forget me"}], extra_body={"store": False})
    sessions = open_database(settings.resolved_database_url)
    with sessions() as session:
        conversations = session.scalars(select(Conversation)).all()
        assert [c.title for c in conversations] == ["keep me"]
        assert [(m.role, m.content) for m in conversations[0].messages] == [("user", "keep me"), ("assistant", REPLY)]


def test_engine_failure_mid_stream_arrives_as_an_error_event(make_server):
    _, http, engine, _ = make_server()
    engine.fail_after_tokens = 2
    with http.stream("POST", "/v1/chat/completions", json={"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "stream": True}) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert "scripted engine failure" in json.loads(events[-1])["error"]["message"]


def test_closing_a_stream_early_aborts_the_generation(make_server):
    client, _, engine, _ = make_server(replies=("a long answer " * 20,))
    engine.token_delay_s = 0.01
    stream = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}], stream=True)
    next(iter(stream))
    next(iter(stream))
    stream.close()
    deadline = time.time() + 5
    while not engine.aborted and time.time() < deadline:
        time.sleep(0.05)
    assert len(engine.aborted) == 1
    assert engine.stats().unfinished == 0
