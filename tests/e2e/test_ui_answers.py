"""How an answer reads in the browser, on a stand-in API that streams a scripted answer (no engine, so the answer
is the same every run): the boxed answer rendered as math with no <answer> tags in view, the raw answer one click
away, one copy control per cell and one for the answer, no label band over the chat, and the conversation listed
once the answer has ended."""

from __future__ import annotations

import pytest

from tests.e2e.chat_page import ask_and_wait, messages_text
from tests.e2e.conftest import ARTIFACTS

ANSWER = "<answer> The bakery still has \\boxed{\\frac{1024}{2}} loaves. </answer>"


def cell(index: int, code: str, stdout: str) -> list[dict]:
    """A code cell's two deltas: when it starts, and when it has run."""
    started = {"index": index, "name": "python_code_with_standard_io", "code": code, "status": "running", "stdout": "", "stderr": "", "duration_s": None}
    return [{"code_cell": started}, {"code_cell": {**started, "status": "ok", "stdout": stdout, "duration_s": 0.02}}]


# Two reasoning blocks around two cells, then the answer: what a word problem's answer looks like.
BAKERY = [
    {"reasoning_content": "The bakery baked 1024 loaves and sold half. Let me compute it."},
    *cell(0, "print(1024 // 2)", "512\n"),
    {"reasoning_content": "Let me check it another way."},
    *cell(1, "print(1024 - 512)", "512\n"),
    {"content": ANSWER},
]


@pytest.fixture
def answered(new_page, stand_in):
    """A page that has asked the bakery question and has its whole answer."""
    api, ui_url = stand_in
    api.answer = BAKERY
    page = new_page(ui_url)
    assert ask_and_wait(page, "How many loaves are left?") == "done"
    return page


def test_a_boxed_answer_renders_as_math_and_its_tags_stay_hidden(answered):
    page = answered
    # KaTeX holds the box, nested braces and all: in the answer line and in the sentence.
    page.wait_for_function("document.querySelectorAll('#chatbot .katex').length >= 2")
    formulas = page.locator("#chatbot .katex annotation").all_text_contents()
    assert formulas.count("\\boxed{\\frac{1024}{2}}") == 2, formulas
    shown = messages_text(page)
    assert "Answer:" in shown and "The bakery still has" in shown
    assert "answer>" not in shown and "\\boxed" not in shown, shown
    page.screenshot(path=str(ARTIFACTS / "answer_rendered.png"), full_page=True)
    # The raw answer, as the model wrote it, is one click away.
    page.locator("#chatbot").get_by_text("Raw answer").click()
    page.locator("#chatbot code", has_text="<answer> The bakery still has").wait_for(state="visible")


def test_an_answer_has_one_copy_control_per_cell_and_one_for_the_answer(answered):
    page = answered
    answer = page.locator("#chatbot .bot-row").last
    code_copies = [button for button in answer.locator(".copy_code_button").all() if button.is_visible()]
    message_copies = [button for button in answer.get_by_role("button", name="Copy message").all() if button.is_visible()]
    assert len(code_copies) == 2 and len(message_copies) == 1
    # Each cell's copies its code; the message copy is the answer's, right under it.
    for button, code in zip(code_copies, ("print(1024 // 2)", "print(1024 - 512)")):
        assert code in button.locator("xpath=..").inner_text()
    under_answer = answer.locator(".message:not(.bot)", has_text="The bakery still has").first.locator("xpath=following-sibling::*[1]")
    assert under_answer.get_by_role("button", name="Copy message").is_visible()
    # No label band over the chat.
    assert page.locator("#chatbot [data-testid=block-label]").count() == 0


def test_the_answered_conversation_is_listed_without_a_refresh(answered, stand_in):
    api, _ = stand_in
    page = answered
    # Every test of this module asked once: the list holds them all, newest first, the open one chosen.
    page.wait_for_function("(count) => document.querySelectorAll('#conversations label').length === count", arg=len(api.conversations))
    newest = page.locator("#conversations label").first
    assert api.conversations[0]["title"] in newest.inner_text() and newest.locator("input").is_checked()
    assert page.locator("#conversations input:checked").count() == 1
