"""A cell that draws two figures, over real HTTP with the official openai client, on the session's real engine
and the server's real sandbox: both come back as PNGs that decode, in order, and the model is told of each
only under the improved protocol. The cell is forced (the request's last assistant message holds the call and
is continued), so the test does not depend on what the small model would write."""

from __future__ import annotations

import base64
import io
import json

import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL_NAME

from rstar.sandbox.tools import PYTHON_TOOL

CODE = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.figure(figsize=(3, 2)).gca().bar([1, 2], [3, 1])\nprint('two figures')"
CALL = json.dumps({"name": PYTHON_TOOL, "arguments": {"code": CODE, "input": ""}})
FORCED = [{"role": "user", "content": "Plot two figures."}, {"role": "assistant", "content": f"I will plot them.\n<tool_call>\n{CALL}\n</tool_call>"}]
DATA_URL = "data:image/png;base64,"


def png_sizes(urls: list[str]) -> list[tuple[int, int]]:
    from PIL import Image

    sizes = []
    for url in urls:
        assert url.startswith(DATA_URL)
        with Image.open(io.BytesIO(base64.b64decode(url[len(DATA_URL) :], validate=True))) as image:
            image.load()  # decodes the whole image, not only its header
            assert image.format == "PNG"
            sizes.append(image.size)
    return sizes


@pytest.mark.parametrize("protocol", ["improved", "released"])
def test_a_cell_s_two_figures_come_back_as_two_pngs(live_server, default_tokenizer, protocol):
    client = openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused")
    completion = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, messages=FORCED, max_tokens=40, temperature=0,
        extra_body={"continue_final_message": True, "return_token_ids": True, "tool_protocol": protocol, "tool_timeout": 30},
    )
    choice = completion.choices[0]
    cell = choice.message.code_cells[0]
    assert (cell["status"], cell["stdout"]) == ("ok", "two figures\n"), cell
    assert png_sizes(cell["images"]) == [(640, 480), (300, 200)] and cell["image_notes"] == []
    # What the model read after its call: a line per figure under improved, the release's text under released.
    tool_turn = default_tokenizer.decode(choice.token_ids[: choice.response_mask.index(1)] if 1 in choice.response_mask else choice.token_ids)
    lines = "stdout: two figures\n\n[image 1: 640x480 PNG]\n[image 2: 300x200 PNG]\nexecution time: "
    if protocol == "improved":
        assert lines in tool_turn, tool_turn
    else:
        assert "stdout: two figures\n\nexecution time: " in tool_turn and "[image" not in tool_turn, tool_turn
    stored = httpx.get(f"{live_server.base_url}/v1/conversations/{completion.conversation_id}").json()
    assert png_sizes(stored["messages"][-1]["code_cells"][0]["images"]) == [(640, 480), (300, 200)]
