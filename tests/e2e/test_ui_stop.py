"""Stop, pressed at varied moments of an endless answer from a stand-in API (no engine): every answer ends marked
"stopped" with its partial text shown, its HTTP stream is closed, and Gradio shows no "Error" over the chat.

Each test starts with no stream open and ends every stream it left open, pass or fail, so none inherits
another's. Waits are on the page's own signals, with the page's patience (chat_page.patience_s) as deadline."""

from __future__ import annotations

import time

import pytest

from tests.e2e.chat_page import answer_signal, error_shown, messages_text, patience_s, wait_for_answer
from tests.waiting import wait_for

STOPS = 10


@pytest.fixture(autouse=True)
def no_stream_outlives_its_test(stand_in):
    """Ends every stream a test left open (a failed test stops no answer), before and after each test."""
    api, _ = stand_in

    def end_all() -> None:
        api.end_streams()
        wait_for(lambda: api.open_streams == 0, timeout_s=30, failure=f"{api.open_streams} stand-in stream(s) did not end")

    end_all()
    yield
    end_all()


def wait_until_no_stream_is_open(api, page, after: str) -> None:
    wait_for(lambda: api.open_streams == 0, timeout_s=patience_s(page), failure=f"an answer's HTTP stream is still open after {after}")


def test_stop_at_any_moment_ends_the_answer_cleanly(new_page, stand_in):
    api, ui_url = stand_in
    page = new_page(ui_url)
    for number in range(STOPS):
        page.click("#new-chat")
        before = answer_signal(page)
        page.fill("#chat-input textarea", f"Count, please ({number}).")
        page.click("#send")
        page.wait_for_function("document.querySelector('#chatbot').innerText.includes('word3')")
        time.sleep(number * 0.05)  # 0 to 0.45 s into the stream
        page.click("#stop")
        assert wait_for_answer(page, before, patience_s(page)) == "stopped"
        wait_until_no_stream_is_open(api, page, f"Stop ({number})")
        time.sleep(0.5)  # Gradio's "Error" label came up to a few hundred ms after a cancelled event
        # Marked as stopped, last in the chat, and Gradio's "Error" label is not over it.
        assert not error_shown(page) and messages_text(page).rstrip().endswith("■ stopped"), number
        # The partial answer stays: its reasoning block, folded once the answer ended, opens on the words.
        page.locator("#chatbot").get_by_text("Reasoning").first.click()
        page.wait_for_function("document.querySelector('#chatbot').innerText.includes('word3')")


def test_two_pages_stream_at_once_and_a_page_sends_again_only_after_its_answer(new_page, stand_in):
    """Answers are I/O on the API, which batches them: one page's answer must not queue behind another's. A page
    holds one conversation, so a message sent while its answer streams is refused with a notice and kept."""
    api, ui_url = stand_in
    first, second = new_page(ui_url), new_page(ui_url)
    signals = {}
    for number, page in enumerate((first, second)):
        # A click before the page has finished loading is lost (seen under CI load): wait for its load event's result.
        page.wait_for_function("document.querySelector('#server-status')?.innerText.includes('Connected to')")
        signals[number] = answer_signal(page)
        page.fill("#chat-input textarea", f"Count, page {number}.")
        page.click("#send")
    wait_for(lambda: api.open_streams == 2, timeout_s=patience_s(first), failure="two pages sent, but not two answer streams are open")
    first.fill("#chat-input textarea", "And again.")
    first.click("#send")
    first.wait_for_function("document.querySelector('#chat-notice').innerText.includes('still coming')")
    assert first.input_value("#chat-input textarea") == "And again." and api.open_streams == 2
    for number, page in enumerate((first, second)):
        page.click("#stop")
        assert wait_for_answer(page, signals[number], patience_s(page)) == "stopped"
    wait_until_no_stream_is_open(api, first, "Stop on both pages")
    # Once the answer has ended, the kept message goes.
    before = answer_signal(first)
    first.click("#send")
    first.wait_for_function("document.querySelector('#chatbot').innerText.includes('And again.')")
    first.click("#stop")
    assert wait_for_answer(first, before, patience_s(first)) == "stopped"
    assert not error_shown(first) and not error_shown(second)


def test_stop_right_after_send_stops_the_answer_before_it_starts(new_page, stand_in):
    """Stop pressed before Gradio has started the answer's handler still reaches that answer."""
    api, ui_url = stand_in
    page = new_page(ui_url)
    for number in range(5):
        before = answer_signal(page)
        page.fill("#chat-input textarea", f"Count, please ({number}).")
        page.click("#send")
        page.click("#stop")
        assert wait_for_answer(page, before, patience_s(page)) == "stopped"
        wait_until_no_stream_is_open(api, page, f"Stop right after Send ({number})")
    assert not error_shown(page)
