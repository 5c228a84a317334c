"""The Chat tab's request building, conversation listing and how Stop ends a stream (the Gradio wiring is
covered by tests/e2e)."""

from __future__ import annotations

import asyncio

import pytest

from rstar.ui.chat import RENDER_INTERVAL_S, batches_until_set, conversation_choices, new_state, render_interval_s, request_payload
from rstar.ui.render import AssistantTurn


class Stream:
    """A server stream: `ready` items, then nothing more until closed (a quiet stream, as during a tool call)."""

    def __init__(self, ready: list[str], then_quiet: bool, gap_s: float = 0.0, fail: Exception | None = None):
        self.ready, self.then_quiet, self.gap_s, self.fail, self.closed = ready, then_quiet, gap_s, fail, False

    async def events(self):
        try:
            for item in self.ready:
                yield item
                await asyncio.sleep(self.gap_s)
            if self.fail:
                raise self.fail
            if self.then_quiet:
                await asyncio.Event().wait()
        finally:
            self.closed = True


def collect(stream: Stream, interval_s: float, stop: asyncio.Event | None = None):
    """The batches of the stream as (arrival time from the start, items), and whether the stream was closed."""

    async def go():
        loop = asyncio.get_running_loop()
        started, batches = loop.time(), []
        async for batch in batches_until_set(stop or asyncio.Event(), stream.events(), lambda: interval_s):
            batches.append((loop.time() - started, batch))
        return batches, stream.closed

    return asyncio.run(go())


def test_stop_ends_a_quiet_stream_and_closes_it():
    async def go():
        stream, stop = Stream(["a", "b"], then_quiet=True), asyncio.Event()
        seen = []

        async def consume():
            async for batch in batches_until_set(stop, stream.events(), lambda: 0.05):
                seen.extend(batch)

        consumer = asyncio.create_task(consume())
        while len(seen) < 2:  # the pending batch goes out once its interval has passed, though nothing follows
            await asyncio.sleep(0.01)
        assert not consumer.done()  # waiting on the quiet stream
        stop.set()
        await asyncio.wait_for(consumer, 1)
        return seen, stream.closed

    assert asyncio.run(go()) == (["a", "b"], True)


def test_without_a_stop_every_item_comes_and_the_stream_is_closed():
    batches, closed = collect(Stream(["a", "b", "c"], then_quiet=False), 0)
    assert [items for _, items in batches] == [["a"], ["b"], ["c"]] and closed


def test_a_fast_stream_comes_in_few_batches_holding_every_item_in_order():
    items = [f"w{n}" for n in range(200)]
    batches, closed = collect(Stream(items, then_quiet=False, gap_s=0.001), 0.05)
    assert [item for _, batch in batches for item in batch] == items and closed
    # 200 items over >= 0.2 s: one batch per 50 ms at most (the first goes at once), not one per item.
    assert len(batches) <= 2 + batches[-1][0] / 0.05 < 50
    gaps = [later - earlier for (earlier, _), (later, _) in zip(batches, batches[1:-1])]
    assert min(gaps) >= 0.045


def test_what_came_before_a_stop_or_a_failure_still_goes_out_at_once():
    async def stop_while_a_batch_waits():
        stop, stream = asyncio.Event(), Stream(["a", "b"], then_quiet=True, gap_s=0.05)
        asyncio.get_running_loop().call_later(0.3, stop.set)  # "b" came at 0.05 s, due in the next batch at 60 s
        return [batch async for batch in batches_until_set(stop, stream.events(), lambda: 60)], stream.closed

    assert asyncio.run(asyncio.wait_for(stop_while_a_batch_waits(), 5)) == ([["a"], ["b"]], True)

    async def failing():
        got = []
        with pytest.raises(RuntimeError, match="connection lost"):
            async for batch in batches_until_set(asyncio.Event(), Stream(["a", "b"], False, fail=RuntimeError("connection lost")).events(), lambda: 60):
                got.append(batch)
        return got

    assert asyncio.run(asyncio.wait_for(failing(), 5)) == [["a"], ["b"]]


def test_a_long_answer_updates_the_page_less_often_as_it_grows():
    short, long = AssistantTurn(), AssistantTurn()
    short.add_reasoning("word " * 100)
    long.add_reasoning("word " * 40_000)
    long.update_cell({"index": 0, "code": "print(1)", "status": "ok", "stdout": "1\n"})
    assert render_interval_s(short, RENDER_INTERVAL_S) == RENDER_INTERVAL_S
    assert 0.4 < render_interval_s(long, RENDER_INTERVAL_S) < 0.6  # 200K characters
    assert render_interval_s(long, 0) == 0  # every event, as asked


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


def test_a_conversation_with_a_container_runs_its_cells_there_and_one_without_names_none():
    assert "container" not in request_payload(new_state(), "hi", "", 0.0, 32, 2, True, "")
    with_files = {**new_state(), "container_id": "cntr_" + "a" * 32}
    assert request_payload(with_files, "sum it", "", 0.0, 32, 2, True, "")["container"] == "cntr_" + "a" * 32


def test_conversation_choices_label_title_and_time():
    choices = conversation_choices([{"id": "a", "title": "", "created_at": 1795988645}, {"id": "b", "title": "x" * 100, "created_at": 0}])
    assert choices[0] == ("(untitled) · 2026-11-29 21:44", "a")  # UTC
    assert choices[1][0].startswith("x" * 60 + " · ") and choices[1][1] == "b"
