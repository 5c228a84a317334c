"""The UI in a real browser against the live API on the real default model: a streamed answer, a code cell
with its output (the forced tool-call path), the stop button, a stored conversation, an eval drill-down."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from rstar.ui.render import strip_tool_calls
from tests.conftest import DEFAULT_MODEL_NAME
from tests.e2e.chat_page import answer_signal, chat_text, error_shown, messages_text, patience_s, wait_for_answer
from tests.e2e.conftest import ARTIFACTS
from tests.eval_run import write_eval_run

MODEL = DEFAULT_MODEL_NAME
# The forced tool-call path (continue_final_message with a complete call); the sleep keeps the cell running
# long enough to be seen running.
FORCED_CALL = '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "import time; time.sleep(1); print(6*7)", "input": ""}}\n</tool_call>'


def set_chat_settings(page, max_tokens: int, temperature: float = 0.0, prefix: str = "") -> None:
    if not page.locator("#max-tokens input").is_visible():
        page.locator("#chat-settings").get_by_text("Settings").click()
    page.fill("#max-tokens input", str(max_tokens))
    page.locator("#max-tokens input").press("Tab")
    page.fill("#temperature input[type=number]", str(temperature))
    page.locator("#temperature input[type=number]").press("Tab")
    if prefix:
        page.fill("#answer-prefix textarea", prefix)


def answer_after(text: str, prompt: str) -> str:
    """The chat's text after the user's message: the answer so far ("…" before its first token)."""
    return text.split(prompt, 1)[1].strip() if prompt in text else ""


# Records every text the chat shows, in the page itself, so no rendered state is missed between polls
# however loaded the machine is.
RECORD_CHAT = """() => {
    const chat = document.querySelector('#chatbot');
    window.chatTexts = [];
    new MutationObserver(() => {
        const text = chat.innerText;
        if (window.chatTexts[window.chatTexts.length - 1] !== text) window.chatTexts.push(text);
    }).observe(chat, {subtree: true, childList: true, characterData: true});
}"""


def test_a_message_streams_an_answer(page):
    prompt = "Count from one to twenty, please."
    set_chat_settings(page, max_tokens=64)
    page.evaluate(RECORD_CHAT)
    before = answer_signal(page)
    page.fill("#chat-input textarea", prompt)
    page.locator("#chat-input textarea").press("Enter")
    assert wait_for_answer(page, before) == "done"
    shown = [answer_after(text, prompt) for text in page.evaluate("window.chatTexts")]
    final = shown[-1]
    assert len(final) > 20 and "⚠" not in final, final
    # Streamed: the page showed the answer growing through several partial states before it settled.
    partials = [text for text in shown[:-1] if text not in ("", "…") and text != final]
    assert len(partials) >= 3, shown
    assert final.startswith(partials[0][:10])


def test_a_code_cell_shows_with_its_output(page):
    set_chat_settings(page, max_tokens=60, prefix="I will run it.\n" + FORCED_CALL)
    page.evaluate(RECORD_CHAT)
    before = answer_signal(page)
    page.fill("#chat-input textarea", "What is 6*7? Use Python.")
    page.click("#send")
    assert wait_for_answer(page, before) == "done"
    # The cell appeared while it ran (code shown, no output yet), then again with its result.
    running = [text for text in page.evaluate("window.chatTexts") if "Python cell 1 · running…" in text]
    assert running and "time.sleep(1); print(6*7)" in running[0] and "stdout" not in running[0]
    cell = page.locator("#chatbot .message", has_text="Python cell 1").first
    text = cell.inner_text()
    assert "print(6*7)" in text and "stdout" in text and "42" in text
    # The code is highlighted Python (Gradio's highlighter wraps tokens in spans), not plain text.
    assert cell.locator("pre code span").count() > 0


def test_a_long_output_is_cut_with_a_way_to_expand(page):
    squares = '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "for i in range(40): print(i * i)", "input": ""}}\n</tool_call>'
    set_chat_settings(page, max_tokens=40, prefix=squares)
    before = answer_signal(page)
    page.fill("#chat-input textarea", "List the first forty squares.")
    page.click("#send")
    assert wait_for_answer(page, before) == "done"
    # The signal comes with the last update; the page may still be drawing the cell it carried.
    page.wait_for_function("document.querySelector('#chatbot').innerText.includes('Python cell 1 · ✓ ok')")
    toggle = page.locator("#chatbot summary", has_text="Show all 40 lines")
    last_square = page.locator("#chatbot code", has_text="1521")  # 39 * 39: past the 20 lines shown
    assert toggle.count() == 1 and "361" in page.locator("#chatbot").inner_text()  # 19 * 19, the head's last
    assert not last_square.first.is_visible()
    toggle.click()
    last_square.first.wait_for(state="visible", timeout=10_000)


def test_the_stop_button_cancels_the_generation_on_the_server(page, live_server):
    set_chat_settings(page, max_tokens=1500, temperature=1.0)
    before = answer_signal(page)
    page.fill("#chat-input textarea", "Write a very long story about a dragon.")
    page.click("#send")
    page.wait_for_function("document.querySelector('#chatbot').innerText.length > 200", timeout=120_000)
    page.screenshot(path=str(ARTIFACTS / "chat_while_streaming.png"), full_page=True)
    page.click("#stop")
    assert wait_for_answer(page, before, patience_s(page)) == "stopped"
    deadline = time.time() + 30
    while httpx.get(f"{live_server.base_url}/health").json()["engine"]["unfinished"] > 0:
        assert time.time() < deadline, "the engine still runs the generation 30 s after Stop"
        time.sleep(0.2)
    stopped = messages_text(page)
    time.sleep(2)
    # Nothing more arrives: no line that was not there at the stop (a finished reasoning block may fold away).
    assert set(messages_text(page).splitlines()) <= set(stopped.splitlines())
    # The partial answer stays, and the stopped event ended cleanly (no "Error" label over the chat).
    assert "dragon" in stopped and not error_shown(page)
    # The chat goes on after a stop (the stopped answer was never stored, so this starts a new conversation).
    set_chat_settings(page, max_tokens=8, temperature=0.0)
    before = answer_signal(page)
    page.fill("#chat-input textarea", "Thanks, that is enough.")
    page.click("#send")
    assert wait_for_answer(page, before) == "done"
    final = chat_text(page)
    assert "Thanks, that is enough." in final and "⚠" not in answer_after(final, "Thanks, that is enough.")


def test_a_stored_conversation_opens(page, live_server):
    probe = "Stored-conversation probe: name a color."
    reply = httpx.post(
        f"{live_server.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": probe}], "max_tokens": 16, "temperature": 0},
        timeout=120,
    ).json()
    conversation_id = reply["conversation_id"]
    page.click("#refresh-conversations")
    page.locator("#conversations label", has_text="Stored-conversation probe").first.click()
    page.wait_for_function(f"document.querySelector('#chatbot').innerText.includes({probe!r})", timeout=30_000)
    shown = chat_text(page)
    message = reply["choices"][0]["message"]
    answer = strip_tool_calls(message.get("content") or "").strip()  # a call cut off by max_tokens has no cell to show
    if answer:
        assert answer[:20] in shown
    if message.get("reasoning_content"):
        assert "Reasoning" in shown
    # Continuing it stores into the same conversation.
    set_chat_settings(page, max_tokens=8)
    before = answer_signal(page)
    page.fill("#chat-input textarea", "And another one?")
    page.click("#send")
    assert wait_for_answer(page, before) == "done"
    stored = httpx.get(f"{live_server.base_url}/v1/conversations/{conversation_id}").json()
    assert [m["content"] for m in stored["messages"] if m["role"] == "user"] == [probe, "And another one?"]
    # Export as JSON downloads the open chat.
    page.click("#export-conversation")
    with page.expect_download() as download:
        page.locator("#export-file a").first.click()
    exported = json.loads(Path(download.value.path()).read_text())
    assert exported["conversation_id"] == conversation_id
    assert [m["content"] for m in exported["messages"] if m["role"] == "user"] == [probe, "And another one?"]
    # Delete removes it on the server.
    page.click("#delete-conversation")
    page.wait_for_function("!document.querySelector('#chatbot').innerText.includes('And another one?')", timeout=30_000)
    assert httpx.get(f"{live_server.base_url}/v1/conversations/{conversation_id}").status_code == 404


def ask_the_api(base_url: str, prompt: str, prefix: str = "") -> dict:
    """One stored exchange made through the API, as a client other than the page makes it."""
    messages = [{"role": "user", "content": prompt}] + ([{"role": "assistant", "content": prefix}] if prefix else [])
    body = {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0, "continue_final_message": bool(prefix)}
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120).json()


def test_conversations_made_through_the_api_are_listed_when_the_page_opens(new_page, ui_url, live_server):
    older = ask_the_api(live_server.base_url, "Listed-on-load probe one: what is 6*7?", prefix="I will run it.\n" + FORCED_CALL)
    newer = ask_the_api(live_server.base_url, "Listed-on-load probe two: name a color.")
    page = new_page(ui_url)
    page.locator("#conversations label", has_text="Listed-on-load probe one").wait_for()
    titles = page.locator("#conversations label").all_inner_texts()
    first, second = (next(i for i, title in enumerate(titles) if probe in title) for probe in ("probe two", "probe one"))
    assert first < second, titles  # newest first
    assert all(" · 20" in title for title in titles), titles  # each with its time
    # Opening one shows its cell as it ran: code, status, output.
    page.locator("#conversations label", has_text="Listed-on-load probe one").click()
    cell = page.locator("#chatbot .message", has_text="Python cell 1").last
    cell.wait_for()
    assert all(text in cell.inner_text() for text in ("✓ ok", "print(6*7)", "stdout", "42"))
    assert older["conversation_id"] != newer["conversation_id"]


def test_an_eval_run_drills_down_to_a_sample_trajectory(page, live_server, tmp_path, default_tokenizer):
    # The runner writes through the server's own database engine; in a thread, as Playwright holds this one's loop.
    with ThreadPoolExecutor(1) as writer:
        written = writer.submit(write_eval_run, live_server.app.state.database, tmp_path / "runs", default_tokenizer).result()
    run_id = written.run_id
    page.get_by_role("tab", name="Evaluations").click()
    page.click("#refresh-runs")
    page.locator("#eval-runs input").click()
    page.locator("#eval-runs [role=option]").first.click()
    page.wait_for_function(f"document.querySelector('#run-header').innerText.includes({run_id!r})", timeout=30_000)
    assert "0.5000" in page.locator("#scores").inner_text()
    page.wait_for_function("document.querySelector('#plot-scores img')?.naturalWidth === 400", timeout=30_000)  # the runner's chart
    assert "Scores, % ± 1 s.e.: aime24 (avg_pass_at_1)" in page.locator("#plot-scores").inner_text()
    page.locator("#samples").get_by_text(str(written.right_doc["id"]), exact=True).filter(visible=True).first.click()
    # The question up to its first formula: its message shows once its math has rendered, which may come after
    # the later messages.
    question = written.right_doc["problem"].split("$")[0].strip()
    page.wait_for_function(
        "(question) => ['Grade: ✓ correct', question].every(text => document.querySelector('#sample-trajectory').innerText.includes(text))",
        arg=question,
        timeout=30_000,
    )
    shown = page.locator("#sample-trajectory").inner_text()
    assert "Python cell 1 · ✓ ok" in shown and written.code in shown
    # The answer renders as in the chat: its box as math, no <answer> tags in view.
    boxed = f"\\boxed{{{written.right_doc['answer']}}}"
    page.wait_for_function("(boxed) => [...document.querySelectorAll('#sample-trajectory .katex annotation')].some(a => a.textContent === boxed)", arg=boxed)
    assert "answer>" not in shown and "Answer:" in shown


def test_the_training_tab_shows_a_run_its_curves_and_last_step(page, live_server):
    from rstar.rl.runs import RunStore

    store = RunStore(live_server.app.state.database)
    store.begin("ui-probe-run", "grpo", "default", {"name": "cpu"}, "problems.jsonl", "/tmp/ui-probe-run", 3)
    for step, reward in ((1, 0.25), (2, 0.5)):
        store.record_step("ui-probe-run", step, "tool-use", {"reward_mean": reward, "solve_rate": 0.5, "tool_call_rate": 1.0, "step_s": 42.0, "rollout_s": 30.0})
    store.finish("ui-probe-run", "finished")
    page.get_by_role("tab", name="Training").click()
    page.click("#refresh-rl-runs")
    page.locator("#rl-runs input").click()
    page.locator("#rl-runs [role=option]", has_text="ui-probe-run").first.click()
    page.wait_for_function("document.querySelector('#rl-run-header').innerText.includes('ui-probe-run')", timeout=30_000)
    assert "step 2/3" in page.locator("#rl-run-header").inner_text()
    page.wait_for_function("document.querySelector('#rl-last-step').innerText.includes('0.5')", timeout=30_000)
    assert "reward_mean" in page.locator("#rl-last-step").inner_text()
    page.wait_for_function("document.querySelector('#rl-curve-0 canvas, #rl-curve-0 svg') !== null", timeout=30_000)
    # A start with data outside the server's roots comes back as the API's one-line error.
    page.get_by_text("Start a GRPO-RoC run").click()
    page.fill("#rl-data textarea", "/etc/passwd")
    page.click("#start-rl-run")
    page.wait_for_function("document.querySelector('#training-notice').innerText.includes('outside the directories')", timeout=30_000)
