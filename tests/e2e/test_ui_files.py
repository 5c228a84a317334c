"""A file attached in the chat is read by the model's code, and the file the code wrote downloads from the page;
once the conversation's container is gone, the next message says its files are gone and is answered all the same:
the UI against a real rstar server on a scripted model (its cell reads /mnt/data/sales.csv and prints the sum)
and the real sandbox, no engine."""

from __future__ import annotations

import tempfile

import httpx
import pytest

from tests.e2e.chat_page import ask_and_wait, messages_text
from tests.processes import serve_in_thread
from tests.scripted_engine import ScriptedEngine, call

SUM_CODE = ("import csv\ntotal = sum(int(r['amount']) for r in csv.DictReader(open('/mnt/data/sales.csv')))\n"
            "open('/mnt/data/total.txt', 'w').write(f'{total}\\n')\nprint('sum', total)")
REPLIES = ["<reason>Sum the column.</reason>\n" + call(SUM_CODE), "The total is 42, written to total.txt."]


@pytest.fixture(scope="module")
def files_ui(default_tokenizer, tmp_path_factory):
    """The UI (its downloads and Gradio's uploads kept in this module's temporary directory) on a server of the
    scripted model and the real sandbox: the UI's URL."""
    from fastapi import FastAPI

    from rstar.app import build_app
    from rstar.config import load_settings
    from rstar.ui.app import UI_PATH, mount_ui

    scratch = tmp_path_factory.mktemp("ui-files")
    settings = load_settings(data_dir=scratch / "data", sandbox={"workers": 1, "spare_cells": 1, "max_sessions": 2, "uid_base": 62400})
    engine = ScriptedEngine(default_tokenizer, REPLIES, model_name="scripted")

    async def factory():
        return engine

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADIO_TEMP_DIR", str(scratch / "gradio"))
        patch.setattr(tempfile, "tempdir", str(scratch))
        api_url, stop_api = serve_in_thread(build_app(settings, factory, "scripted"))
        ui_url, stop_ui = serve_in_thread(mount_ui(FastAPI(), api_url))
        yield f"{ui_url}{UI_PATH}/", scratch, api_url
        stop_ui()
        stop_api()


def test_an_attached_csv_is_read_by_the_code_and_the_file_it_wrote_downloads(new_page, files_ui):
    ui_url, scratch, api_url = files_ui
    csv = scratch / "sales.csv"
    csv.write_text("amount\n30\n12\n")
    page = new_page(ui_url)
    page.set_input_files("#attachments input[type=file]", str(csv))
    page.locator("#attachments").get_by_text("sales.csv").first.wait_for()
    assert ask_and_wait(page, "What is the total amount?") == "done"
    shown = messages_text(page)
    assert "Attached: /mnt/data/sales.csv" in shown and "sum 42" in shown, shown
    link = page.locator("#chatbot a", has_text="total.txt").first
    with page.expect_download() as download:
        link.click()
    assert download.value.suggested_filename == "total.txt"
    assert open(download.value.path(), "rb").read() == b"42\n"

    # The container expires (deleted here, as the purge would): the next message is answered, with the notice.
    (container,) = httpx.get(f"{api_url}/v1/containers").json()["data"]
    assert httpx.delete(f"{api_url}/v1/containers/{container['id']}").status_code == 200
    assert ask_and_wait(page, "And now?") == "done"
    assert "files expired with its container" in page.locator("#chat-notice").inner_text()
    assert messages_text(page).count("The total is 42") == 2
