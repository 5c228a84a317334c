"""A cell's figures in the browser, on the stand-in API (no engine): both PNGs a cell returned are drawn inline,
in order, and decode in the page."""

from __future__ import annotations

import base64
import io

from tests.e2e.chat_page import ask_and_wait


def png_url(width: int, height: int, colour: str) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


FIRST, SECOND = png_url(64, 48, "red"), png_url(30, 20, "blue")
STARTED = {"index": 0, "name": "python_code_with_standard_io", "code": "plot()", "status": "running", "stdout": "", "stderr": "", "duration_s": None,
           "images": [], "image_notes": []}
FIGURES = [
    {"reasoning_content": "Let me plot it."},
    {"code_cell": STARTED},
    {"code_cell": {**STARTED, "status": "ok", "stdout": "drawn\n", "duration_s": 0.3, "images": [FIRST, SECOND]}},
    {"content": "Two plots."},
]


def test_both_figures_of_a_cell_are_shown_in_order(new_page, stand_in):
    api, ui_url = stand_in
    api.answer = FIGURES
    page = new_page(ui_url)
    assert ask_and_wait(page, "Plot two things.") == "done"
    images = page.locator('#chatbot img[alt^="figure"]')
    images.nth(1).wait_for(state="visible")
    shown = images.evaluate_all("(all) => all.map(img => [img.alt, img.naturalWidth, img.naturalHeight, img.getAttribute('src').length])")
    assert [(alt, width, height) for alt, width, height, _ in shown] == [("figure 1 of cell 1", 64, 48), ("figure 2 of cell 1", 30, 20)], shown
    assert [length for *_, length in shown] == [len(FIRST), len(SECOND)]
