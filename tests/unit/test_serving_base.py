"""The serving base's shared pieces: per-choice seeds, SSE framing, logprob decoding, the one request
deadline, and engine refusals as the client's 400, on every generating endpoint."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from rstar.server.agent_loop import run_trajectory
from rstar.server.engine import SamplingOptions, TokenDelta
from rstar.server.errors import APIError
from rstar.server.limits import RequestTimeout, with_deadline
from rstar.server.serving_base import SSE_DONE, decode_logprobs, per_choice, refusals_as_client_errors, sse
from tests.scripted_engine import ScriptedEngine
from tests.scripted_sandbox import ScriptedSandbox
from tests.unit.api_server import make_server  # noqa: F401 (fixture)

QUESTION = [{"role": "user", "content": "What is 2+2?"}]


def test_each_choice_gets_its_own_seed_and_no_seed_stays_none():
    seeded = per_choice(SamplingOptions(max_tokens=5, seed=7, temperature=0.5), 3)
    assert [options.seed for options in seeded] == [7, 8, 9]
    assert {options.temperature for options in seeded} == {0.5}
    assert [options.seed for options in per_choice(SamplingOptions(max_tokens=5), 2)] == [None, None]


def test_sse_frames_data_and_named_events():
    assert sse('{"a": 1}') == 'data: {"a": 1}\n\n'
    assert sse("{}", "response.created") == "event: response.created\ndata: {}\n\n"
    assert SSE_DONE == "data: [DONE]\n\n"


def test_logprobs_decode_each_token_and_rank_the_alternatives():
    words = {1: "a", 2: "b", 3: "c"}

    def decode(ids):
        return "".join(words[i] for i in ids)

    delta = TokenDelta(token_ids=[1, 2], text="ab", logprobs=[-0.1, -2.0], top_logprobs=[{3: -3.0, 1: -0.1}, {2: -2.0}])
    entries = decode_logprobs(decode, delta)
    assert [(e.token, e.logprob, e.top) for e in entries] == [("a", -0.1, [("a", -0.1), ("c", -3.0)]), ("b", -2.0, [("b", -2.0)])]
    assert decode_logprobs(decode, TokenDelta(token_ids=[1], text="a")) == []


def test_the_deadline_closes_the_events_and_times_out():
    closed = []

    async def slow():
        try:
            for i in range(100):
                await asyncio.sleep(0.05)
                yield i
        finally:
            closed.append(True)

    async def drain():
        seen = []
        with pytest.raises(RequestTimeout) as err:
            async for item in with_deadline(slow(), 0.2):
                seen.append(item)
                await asyncio.sleep(0.05)  # the consumer's own time counts against the deadline too
        return seen, err.value

    seen, error = asyncio.run(drain())
    assert 0 < len(seen) < 4 and closed == [True]
    assert error.status == 504 and "0.2 s" in error.message


async def _vllm_like_refusal(*args, **kwargs):
    """What AsyncLLM.generate does with input it refuses: raises ValueError before its first output."""
    raise ValueError("Token id 99999 is out of vocabulary")
    yield  # an async generator, as the engine's is


def test_a_refusal_before_any_token_is_a_400_and_after_one_passes_through():
    async def one_then_refuse():
        yield 1
        raise ValueError("late")

    async def drain(events, generated):
        return [item async for item in refusals_as_client_errors(events, generated)]

    with pytest.raises(APIError) as err:
        asyncio.run(drain(_vllm_like_refusal(), lambda: False))
    assert err.value.status == 400 and "out of vocabulary" in err.value.message
    with pytest.raises(ValueError, match="late"):
        asyncio.run(drain(one_then_refuse(), lambda: True))


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {"messages": QUESTION}),
        ("/v1/completions", {"prompt": "2+2="}),
        ("/v1/responses", {"input": "What is 2+2?"}),
    ],
)
def test_an_engine_refusal_is_a_400_on_every_generating_endpoint(make_server, path, body):
    _, http, engine, _ = make_server()
    engine.generate = _vllm_like_refusal
    reply = http.post(path, json={"model": "scripted", **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and "out of vocabulary" in error["message"]
    assert http.get("/health").json()["admission"]["running"] == 0


def test_an_engine_refusal_in_a_stream_is_a_400_error_event(make_server):
    client, _, engine, _ = make_server()
    engine.generate = _vllm_like_refusal
    with pytest.raises(openai.APIError) as err:
        for _ in client.chat.completions.create(model="scripted", messages=QUESTION, stream=True):
            pass
    assert "out of vocabulary" in err.value.message and err.value.body["code"] == 400


def test_the_loop_starts_from_prompt_ids_it_is_given(default_tokenizer):
    from rstar.server.chat_template import rstar_template

    template = rstar_template(default_tokenizer)
    engine = ScriptedEngine(default_tokenizer, ["4"])
    given = template.encode(QUESTION, []) + [template.encode_text("\n")[0]]  # differs from what it would encode

    sandbox = ScriptedSandbox()
    trajectory = asyncio.run(run_trajectory(engine, template, QUESTION, [], SamplingOptions(max_tokens=4), sandbox.executor(), prompt_ids=given))
    assert engine.prompts == [given] and trajectory.prompt_ids == given and sandbox.requests == []


def test_the_api_encodes_the_prompt_once_and_the_loop_uses_it(make_server, monkeypatch):
    from rstar.server.chat_template import ChatTemplate

    client, _, engine, _ = make_server()
    encoded = []
    original = ChatTemplate.encode

    def counting_encode(self, *args, **kwargs):
        encoded.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ChatTemplate, "encode", counting_encode)
    completion = client.chat.completions.create(model="scripted", messages=QUESTION)
    assert len(encoded) == 1 and completion.usage.prompt_tokens == len(engine.prompts[0])


def test_template_variants_are_built_once_and_their_cache_stays_bounded(make_server):
    from rstar.server.serving_base import MAX_CACHED_TEMPLATES

    _, http, _, _ = make_server()
    serving = http.app.state.serving
    first = serving.template_for("rstar", {"math_instruction": False})
    assert serving.template_for("rstar", {"math_instruction": False}) is first  # compiled once, reused
    for n in range(2 * MAX_CACHED_TEMPLATES):  # a client sending ever new values
        assert serving.template_for("rstar", {"math_instruction": n}).variables == (("math_instruction", n),)
    assert len(serving.templates) <= MAX_CACHED_TEMPLATES
    # A variable the template does not read is left out and makes no new variant.
    assert serving.template_for("rstar", {"math_instruction": False, "nonce": 1}) is first
