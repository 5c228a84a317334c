"""Reading the Chat tab in a browser page: its text, its messages, the UI's end-of-answer signal, and how long
to wait for it on this machine."""

from __future__ import annotations

import weakref

from playwright.sync_api import TimeoutError as PlaywrightTimeout

# How long each open page took to load here (tests/e2e/conftest.py's new_page measures it).
_LOAD_S: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def loaded_in(page, seconds: float) -> None:
    _LOAD_S[page] = seconds


def patience_s(page) -> float:
    """How long a wait on this page's own signals may take before the test fails: 30 s, or 20 times what loading
    the page took on this machine if that is longer. A wait returns as soon as its signal shows, so a generous
    deadline costs a passing test nothing; a fixed one meant for a fast CPU fails on a slow one."""
    return max(30.0, 20 * _LOAD_S.get(page, 0.0))


def chat_text(page) -> str:
    return page.locator("#chatbot").inner_text()


def messages_text(page) -> str:
    """The chat's messages alone, without the status label Gradio lays over the chat."""
    return "\n".join(page.locator("#chatbot .message-row").all_inner_texts())


def answer_signal(page) -> str:
    """The chat's end-of-answer signal: `<answer number> <streaming|done|stopped>`, set by the UI in the same
    update as an answer's first and last message."""
    return (page.locator("#answer-state").text_content() or "").strip()


def wait_for_answer(page, before: str, timeout_s: float = 300) -> str:
    """Wait until the answer sent after the signal read `before` has ended; returns how ("done" or "stopped").

    The answer must start within the page's patience (its first update sets the signal before any model call),
    so a send the page never acted on fails at once and says what the page showed, rather than after the whole
    answer's deadline. The end's default is sized for a real engine's answer; a stop's end is the page's alone
    (`patience_s`)."""
    try:
        page.wait_for_function(
            "(before) => document.querySelector('#answer-state').textContent.trim() !== before",
            arg=before,
            timeout=patience_s(page) * 1000,
        )
    except PlaywrightTimeout:
        raise AssertionError(f"the send started no answer in {patience_s(page):.0f} s; {page_state(page)}") from None
    page.wait_for_function(
        """(before) => {
            const signal = document.querySelector('#answer-state').textContent.trim();
            return signal !== before && / (done|stopped)$/.test(signal);
        }""",
        arg=before,
        timeout=timeout_s * 1000,
    )
    return answer_signal(page).split()[-1]


def page_state(page) -> str:
    """What a failed wait found on the chat page: the end-of-answer signal, the input box, the status lines."""
    return (
        f"signal {answer_signal(page)!r}, input box {page.input_value('#chat-input textarea')!r}, "
        f"server status {page.locator('#server-status').inner_text()!r}, Gradio error shown: {error_shown(page)}, "
        f"chat {messages_text(page)[-300:]!r}"
    )


def ask_and_wait(page, question: str) -> str:
    """Send `question` with the Send button and wait for its whole answer; returns how it ended."""
    before = answer_signal(page)
    page.fill("#chat-input textarea", question)
    page.click("#send")
    return wait_for_answer(page, before)


def error_shown(page) -> bool:
    """Whether Gradio's status label over the chat reads "Error" (a failed event)."""
    return page.locator("#chatbot .error").count() > 0
