"""A cell's figures through the server: the tool text each protocol shows the model (golden), the chat answer's
`code_cells[i].images` and the Responses `code_interpreter_call` outputs, on the scripted engine and sandbox."""

from __future__ import annotations

import base64
import io

import pytest

from rstar.sandbox.schemas import CellImage, RunResult
from rstar.server.schemas import CodeCell
from rstar.server.tool_results import render_exec_result
from rstar.server.trajectory import ToolCallRecord
from tests.unit.api_server import QUESTION, TOOL_TURNS, make_server, sandbox_of  # noqa: F401 (fixture)


def png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(buffer, format="PNG")
    return buffer.getvalue()


def image(width: int, height: int) -> CellImage:
    return CellImage(width=width, height=height, data=base64.b64encode(png(width, height)).decode())


NOTE = "figure 3 not returned: 5000x5000 pixels is over the 4194304-pixel cap (max_image_pixels)"
WITH_FIGURES = RunResult(status="ok", exit_code=0, stdout="drawn\n", duration_s=0.25, images=[image(64, 48), image(30, 20)], image_notes=[NOTE])
WITHOUT = WITH_FIGURES.model_copy(update={"images": [], "image_notes": []})


def test_released_text_is_the_release_s_whatever_the_figures():
    text = render_exec_result(WITH_FIGURES, "released")
    assert text == render_exec_result(WITHOUT, "released") == "Tool call success\nstdout: drawn\n\nexecution time: 0.25s"


def test_improved_text_has_a_line_per_image_and_per_note_before_the_time():
    assert render_exec_result(WITH_FIGURES, "improved") == (
        "Tool call success\nstdout: drawn\n\n[image 1: 64x48 PNG]\n[image 2: 30x20 PNG]\n"
        f"[{NOTE}]\nexecution time: 0.25s"
    )
    assert render_exec_result(WITHOUT, "improved") == render_exec_result(WITHOUT, "released")


def test_a_record_keeps_the_images_as_data_urls_and_the_cell_shows_them():
    record = ToolCallRecord(turn=0, index=0, raw="", name="python_code_with_standard_io", arguments={}, decode_error=None, response=None, code="x")
    record.answer("text", 0.0, 0.1, WITH_FIGURES)
    cell = CodeCell.of_record(record)
    assert cell.images == [f"data:image/png;base64,{base64.b64encode(png(64, 48)).decode()}", WITH_FIGURES.images[1].data_url()]
    assert cell.image_notes == [NOTE]
    plain = ToolCallRecord(turn=0, index=1, raw="", name="python_code_with_standard_io", arguments={}, decode_error=None, response=None, code="y")
    plain.answer("text", 0.0, 0.1, WITHOUT)
    assert plain.images is None and CodeCell.of_record(plain).model_dump()["images"] == []


def test_cell_image_data_must_be_base64():
    with pytest.raises(ValueError):
        CellImage(width=1, height=1, data="AAAA) <script>")


def decode_data_url(url: str) -> bytes:
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    return base64.b64decode(url[len(prefix) :], validate=True)


@pytest.mark.parametrize("protocol", ["improved", "released"])
def test_chat_answer_carries_the_images_and_the_model_sees_lines_only_when_improved(make_server, protocol):
    client, http, engine, _ = make_server(replies=TOOL_TURNS)
    sandbox_of(http).outputs["print(6*7)"] = "42\n"
    sandbox_of(http).images["print(6*7)"] = [image(64, 48), image(30, 20)]
    answer = client.chat.completions.create(model="scripted", messages=QUESTION, extra_body={"tool_protocol": protocol})
    cell = answer.choices[0].message.code_cells[0]
    assert [decode_data_url(url) for url in cell["images"]] == [png(64, 48), png(30, 20)]
    second_prompt = engine.tokenizer.decode(engine.prompts[1])
    lines = "[image 1: 64x48 PNG]\n[image 2: 30x20 PNG]\n"
    assert (lines in second_prompt) == (protocol == "improved"), second_prompt
    assert "[image" not in second_prompt or protocol == "improved"


def test_responses_outputs_are_the_logs_then_each_image(make_server):
    client, http, _, _ = make_server(replies=TOOL_TURNS)
    sandbox_of(http).outputs["print(6*7)"] = "42\n"
    sandbox_of(http).images["print(6*7)"] = [image(64, 48), image(30, 20)]
    response = client.responses.create(model="scripted", input="What is 6*7?", tools=[{"type": "code_interpreter", "container": {"type": "auto"}}])
    cell = next(item for item in response.output if item.type == "code_interpreter_call")
    assert [output.type for output in cell.outputs] == ["logs", "image", "image"]
    assert cell.outputs[0].logs == "42\n"
    assert [decode_data_url(output.url) for output in cell.outputs[1:]] == [png(64, 48), png(30, 20)]
