"""Stop, pressed at varied moments of an endless answer from a stand-in API (no engine): every answer ends as
stopped with its partial text shown, its HTTP stream is closed, and Gradio shows no "Error" over the chat.

Each test starts with no stream open and ends every stream it left open, pass or fail, so none inherits
another's. Waits are on the page's own signals, with the page's patience (chat_page.patience_s) as deadline."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.e2e.chat_page import answer_signal, error_shown, patience_s, wait_for_answer
from tests.processes import serve_in_thread
from tests.waiting import wait_for

STOPS = 10


@pytest.fixture(scope="module")
def endless_api():
    """An API whose chat answers stream reasoning words, one every 10 ms, until the fixture's `generation` moves
    on; `open` counts the streams still open."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app, streams = FastAPI(), {"open": 0, "generation": 0}

    @app.get("/health")
    def health():
        return {"model": "endless"}

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "endless"}]}

    @app.get("/v1/conversations")
    def conversations(limit: int = 50, offset: int = 0):
        return {"data": []}

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        async def words():
            streams["open"] += 1
            generation = streams["generation"]
            try:
                for number in range(1, 1_000_000):
                    if streams["generation"] != generation:
                        return
                    yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"reasoning_content": f"word{number} "}}]}) + "\n\n"
                    await asyncio.sleep(0.01)
            finally:
                streams["open"] -= 1

        return StreamingResponse(words(), media_type="text/event-stream")

    base_url, stop = serve_in_thread(app)
    yield base_url, streams
    stop()


@pytest.fixture(autouse=True)
def no_stream_outlives_its_test(endless_api):
    """Ends every stream a test left open (a failed test stops no answer), before and after each test."""
    _, streams = endless_api

    def end_all() -> None:
        streams["generation"] += 1
        wait_for(lambda: streams["open"] == 0, timeout_s=30, failure=f"{streams['open']} stand-in stream(s) did not end")

    end_all()
    yield
    end_all()


def wait_until_no_stream_is_open(streams: dict, page, after: str) -> None:
    wait_for(lambda: streams["open"] == 0, timeout_s=patience_s(page), failure=f"an answer's HTTP stream is still open after {after}")


@pytest.fixture(scope="module")
def ui_on_endless_api(endless_api):
    from fastapi import FastAPI

    from rstar.ui.app import UI_PATH, mount_ui

    base_url, stop = serve_in_thread(mount_ui(FastAPI(), endless_api[0]))
    yield f"{base_url}{UI_PATH}/"
    stop()


def test_stop_at_any_moment_ends_the_answer_cleanly(new_page, ui_on_endless_api, endless_api):
    _, streams = endless_api
    page = new_page(ui_on_endless_api)
    for number in range(STOPS):
        page.click("#new-chat")
        before = answer_signal(page)
        page.fill("#chat-input textarea", f"Count, please ({number}).")
        page.click("#send")
        page.wait_for_function("document.querySelector('#chatbot').innerText.includes('word3')")
        time.sleep(number * 0.05)  # 0 to 0.45 s into the stream
        page.click("#stop")
        assert wait_for_answer(page, before, patience_s(page)) == "stopped"
        wait_until_no_stream_is_open(streams, page, f"Stop ({number})")
        time.sleep(0.5)  # Gradio's "Error" label came up to a few hundred ms after a cancelled event
        assert not error_shown(page), number
        # The partial answer stays: its reasoning block, folded once the answer ended, opens on the words.
        page.locator("#chatbot").get_by_text("Reasoning").first.click()
        page.wait_for_function("document.querySelector('#chatbot').innerText.includes('word3')")


def test_two_pages_stream_at_once_and_a_page_sends_again_only_after_its_answer(new_page, ui_on_endless_api, endless_api):
    """Answers are I/O on the API, which batches them: one page's answer must not queue behind another's. A page
    holds one conversation, so a message sent while its answer streams is refused with a notice and kept."""
    _, streams = endless_api
    first, second = new_page(ui_on_endless_api), new_page(ui_on_endless_api)
    signals = {}
    for number, page in enumerate((first, second)):
        # A click before the page has finished loading is lost (seen under CI load): wait for its load event's result.
        page.wait_for_function("document.querySelector('#server-status')?.innerText.includes('Connected to')")
        signals[number] = answer_signal(page)
        page.fill("#chat-input textarea", f"Count, page {number}.")
        page.click("#send")
    wait_for(lambda: streams["open"] == 2, timeout_s=patience_s(first), failure="two pages sent, but not two answer streams are open")
    first.fill("#chat-input textarea", "And again.")
    first.click("#send")
    first.wait_for_function("document.querySelector('#chat-notice').innerText.includes('still coming')")
    assert first.input_value("#chat-input textarea") == "And again." and streams["open"] == 2
    for number, page in enumerate((first, second)):
        page.click("#stop")
        assert wait_for_answer(page, signals[number], patience_s(page)) == "stopped"
    wait_until_no_stream_is_open(streams, first, "Stop on both pages")
    # Once the answer has ended, the kept message goes.
    before = answer_signal(first)
    first.click("#send")
    first.wait_for_function("document.querySelector('#chatbot').innerText.includes('And again.')")
    first.click("#stop")
    assert wait_for_answer(first, before, patience_s(first)) == "stopped"
    assert not error_shown(first) and not error_shown(second)


def test_stop_right_after_send_stops_the_answer_before_it_starts(new_page, ui_on_endless_api, endless_api):
    """Stop pressed before Gradio has started the answer's handler still reaches that answer."""
    _, streams = endless_api
    page = new_page(ui_on_endless_api)
    for number in range(5):
        before = answer_signal(page)
        page.fill("#chat-input textarea", f"Count, please ({number}).")
        page.click("#send")
        page.click("#stop")
        assert wait_for_answer(page, before, patience_s(page)) == "stopped"
        wait_until_no_stream_is_open(streams, page, f"Stop right after Send ({number})")
    assert not error_shown(page)
