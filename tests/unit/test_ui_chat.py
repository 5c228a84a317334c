"""The Chat tab's request building, conversation listing and how Stop ends a stream (the Gradio wiring is
covered by tests/e2e)."""

from __future__ import annotations

import asyncio

from rstar.ui.chat import conversation_choices, new_state, request_payload, until_set


class Stream:
    """A server stream: `ready` items, then nothing more until closed (a quiet stream, as during a tool call)."""

    def __init__(self, ready: list[str], then_quiet: bool):
        self.ready, self.then_quiet, self.closed = ready, then_quiet, False

    async def events(self):
        try:
            for item in self.ready:
                yield item
            if self.then_quiet:
                await asyncio.Event().wait()
        finally:
            self.closed = True


def test_stop_ends_a_quiet_stream_and_closes_it():
    async def go():
        stream, stop = Stream(["a", "b"], then_quiet=True), asyncio.Event()
        seen = []

        async def consume():
            async for item in until_set(stop, stream.events()):
                seen.append(item)

        consumer = asyncio.create_task(consume())
        while len(seen) < 2:
            await asyncio.sleep(0)
        assert not consumer.done()  # waiting on the quiet stream
        stop.set()
        await asyncio.wait_for(consumer, 1)
        return seen, stream.closed

    assert asyncio.run(go()) == (["a", "b"], True)


def test_without_a_stop_every_item_comes_and_the_stream_is_closed():
    async def go():
        stream = Stream(["a", "b", "c"], then_quiet=False)
        return [item async for item in until_set(asyncio.Event(), stream.events())], stream.closed

    assert asyncio.run(go()) == (["a", "b", "c"], True)


def test_payload_carries_history_settings_and_the_stored_conversation():
    state = {
        "conversation_id": "c1",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello", "reasoning_content": "greet", "code_cells": [{"index": 0}]},
        ],
        "display": [],
    }
    payload = request_payload(state, "2+2?", "m", 0.3, 64, 5, False, "Be brief.")
    assert payload == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},  # reasoning and cells stay in the page, not the prompt
            {"role": "user", "content": "2+2?"},
        ],
        "temperature": 0.3,
        "max_tokens": 64,
        "max_turns": 5,
        "builtin_tools": False,
        "conversation_id": "c1",
    }


def test_an_answer_prefix_is_continued_and_a_new_chat_has_no_conversation_yet():
    payload = request_payload(new_state(), "6*7?", "", 0.0, 32.0, 2.0, True, "", prefix="<tool_call>{}</tool_call>")
    assert payload["messages"][-1] == {"role": "assistant", "content": "<tool_call>{}</tool_call>"}
    assert payload["continue_final_message"] is True and payload["model"] == "default"
    assert "conversation_id" not in payload and payload["messages"][0]["role"] == "user"
    assert isinstance(payload["max_tokens"], int) and isinstance(payload["max_turns"], int)


def test_conversation_choices_label_title_and_time():
    choices = conversation_choices([{"id": "a", "title": "", "created_at": 1795988645}, {"id": "b", "title": "x" * 100, "created_at": 0}])
    assert choices[0] == ("(untitled) · 2026-11-29 21:44", "a")  # UTC
    assert choices[1][0].startswith("x" * 60 + " · ") and choices[1][1] == "b"
