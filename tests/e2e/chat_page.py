"""Reading the Chat tab in a browser page: its text, its messages, and the UI's end-of-answer signal."""

from __future__ import annotations


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
    """Wait until the answer sent after the signal read `before` has ended; returns how ("done" or "stopped")."""
    page.wait_for_function(
        """(before) => {
            const signal = document.querySelector('#answer-state').textContent.trim();
            return signal !== before && / (done|stopped)$/.test(signal);
        }""",
        arg=before,
        timeout=timeout_s * 1000,
    )
    return answer_signal(page).split()[-1]


def error_shown(page) -> bool:
    """Whether Gradio's status label over the chat reads "Error" (a failed event)."""
    return page.locator("#chatbot .error").count() > 0
