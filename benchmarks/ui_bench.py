"""The chat page under a fast stream: does it keep up, and what does each streamed chunk cost?

A stand-in API (no engine) streams one long answer, one token per chunk at a fixed rate, to the chat page of
`rstar ui` (its own process) open in one and in two headless Chromium pages at once. Compared, in one run:

  coalesced   the UI as it ships: an answer updates the page at most every 1/15 s, each update carrying
              everything that arrived (`rstar ui`'s default)
  per_event   the same UI updating the page on every streamed chunk (`rstar ui --render-interval 0`), which
              is what a Gradio chat handler does when it yields per token

For each: the lag between the last chunk sent and the page saying the answer is done (the UI's own
`#answer-state` signal, set in the update that carries the last chunk), the page's main-thread CPU per chunk
(Chrome's TaskDuration), the whole browser's and the UI process's CPU per chunk. A page that has not caught up
`cap_s` after the last chunk is recorded as such (lag null, `caught_up` false). The JSON records the CPU.

    python benchmarks/ui_bench.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from goals import goal, print_goals
from rstar.hardware import cpu_info

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' support modules: ports, servers, the browser
from tests.processes import CHROMIUM, CHROMIUM_ARGS, free_port, serve_in_thread, start_logged  # noqa: E402

CHUNKS_PER_S = 100
ANSWER_TOKENS = 100  # the last tokens of the answer are its content, after the reasoning
MODES = {"coalesced": None, "per_event": 0.0}


def standin_api(tokens: int):
    """A FastAPI app whose chat answers stream `tokens` tokens at CHUNKS_PER_S; `ended` maps each stream's number
    to the wall-clock time its last chunk was sent."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app, ended = FastAPI(), {}

    @app.get("/health")
    def health():
        return {"model": "standin"}

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "standin"}]}

    @app.get("/v1/conversations")
    def conversations(limit: int = 50, offset: int = 0):
        return {"data": []}

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        number = len(ended)
        ended[number] = None

        def chunk(delta: dict, finish: str | None = None) -> str:
            return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"

        async def answer():
            loop = asyncio.get_running_loop()
            start = loop.time()
            for position in range(tokens):
                # On a schedule, not a sleep per chunk, so the rate holds whatever each send costs.
                await asyncio.sleep(max(0.0, start + position / CHUNKS_PER_S - loop.time()))
                field = "reasoning_content" if position < tokens - ANSWER_TOKENS else "content"
                yield chunk({field: f"w{position} " if position % 12 else f"w{position}.\n\n"})
            yield chunk({}, "stop")
            ended[number] = time.time()
            yield "data: [DONE]\n\n"

        return StreamingResponse(answer(), media_type="text/event-stream")

    return app, ended


def start_ui(endpoint: str, render_interval: float | None, log_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [str(Path(sys.executable).with_name("rstar")), "ui", "--endpoint", endpoint, "--port", str(port)]
    if render_interval is not None:
        command += ["--render-interval", str(render_interval)]
    url = f"http://127.0.0.1:{port}/ui/"
    return start_logged(command, dict(os.environ), log_dir / f"ui-{port}.log", url), url


def cpu_seconds(process: psutil.Process) -> float:
    """CPU time of a process and all its descendants still alive."""
    total = 0.0
    for member in [process, *process.children(recursive=True)]:
        try:
            times = member.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


# Set in each page: the wall-clock time (ms) the UI first said this answer was done.
WATCH_DONE = """(before) => {
    window.__doneAt = null;
    const timer = setInterval(() => {
        const signal = document.querySelector('#answer-state').textContent.trim();
        if (signal !== before && signal.endsWith(' done')) { window.__doneAt = Date.now(); clearInterval(timer); }
    }, 20);
}"""


def measure(browser, browser_process: psutil.Process, url: str, ended: dict, ui: subprocess.Popen, pages: int, tokens: int, cap_s: float) -> dict:
    contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(pages)]
    opened = [context.new_page() for context in contexts]
    sessions = []
    for page in opened:
        page.goto(url)
        page.wait_for_selector("#chat-input textarea", timeout=60_000)
        page.wait_for_function("document.querySelector('#server-status')?.innerText.includes('Connected to')", timeout=60_000)
        session = page.context.new_cdp_session(page)
        session.send("Performance.enable")
        sessions.append(session)
    ui_process = psutil.Process(ui.pid)

    def page_task_s(session) -> float:
        return next(m["value"] for m in session.send("Performance.getMetrics")["metrics"] if m["name"] == "TaskDuration")

    tasks_before = [page_task_s(session) for session in sessions]
    browser_before, ui_before = cpu_seconds(browser_process), cpu_seconds(ui_process)
    first_stream = len(ended)
    for page in opened:
        before = (page.locator("#answer-state").text_content() or "").strip()
        page.evaluate(WATCH_DONE, before)
        page.fill("#chat-input textarea", "Think out loud for a long while.")
        page.click("#send")
    streams = range(first_stream, first_stream + pages)
    while any(ended.get(number) is None for number in streams):
        time.sleep(0.1)
    last_sent = max(ended[number] for number in streams)
    deadline = time.time() + cap_s
    shown_at = [None] * pages
    while time.time() < deadline and None in shown_at:
        for index, page in enumerate(opened):
            if shown_at[index] is None:
                shown_at[index] = page.evaluate("window.__doneAt")
        time.sleep(0.1)
    tasks = [page_task_s(session) - before for session, before in zip(sessions, tasks_before)]
    browser_cpu, ui_cpu = cpu_seconds(browser_process) - browser_before, cpu_seconds(ui_process) - ui_before
    for context in contexts:
        context.close()
    lags = [None if at is None else round(at / 1000 - ended[number], 3) for at, number in zip(shown_at, streams)]
    chunks = tokens * pages
    return {
        "pages": pages,
        "tokens_per_answer": tokens,
        "caught_up": all(lag is not None for lag in lags),
        "lag_s": lags,
        "max_lag_s": max(lags) if all(lag is not None for lag in lags) else None,
        "last_chunk_to_cap_s": cap_s,
        "page_task_ms_per_chunk": [round(1000 * seconds / tokens, 3) for seconds in tasks],
        "browser_cpu_ms_per_chunk": round(1000 * browser_cpu / chunks, 3),
        "ui_cpu_ms_per_chunk": round(1000 * ui_cpu / chunks, 3),
        "stream_s": round(last_sent - min(ended[number] for number in streams) + tokens / CHUNKS_PER_S, 1),
    }


def run(quick: bool) -> dict:
    from playwright.sync_api import sync_playwright

    tokens = 1_500 if quick else 10_000
    cap_s = 20.0 if quick else 60.0
    app, ended = standin_api(tokens)
    endpoint, _ = serve_in_thread(app)
    log_dir = Path(tempfile.mkdtemp(prefix="ui_bench-"))
    results: dict[str, dict] = {}
    with sync_playwright() as playwright:
        before = {p.pid for p in psutil.process_iter() if p.name() == "chromium"}
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        # The browser's root process: the chromium that Playwright started, whose descendants are its pages.
        started = [p for p in psutil.Process().children(recursive=True) if p.name() == "chromium" and p.pid not in before]
        browser_process = min(started, key=lambda p: p.create_time())
        for mode, render_interval in MODES.items():
            ui, url = start_ui(endpoint, render_interval, log_dir)
            try:
                for pages in (1, 2):
                    print(f"measuring {mode} with {pages} page(s), {tokens} tokens at {CHUNKS_PER_S}/s ...", flush=True)
                    results[f"{mode}_{pages}_pages"] = measure(browser, browser_process, url, ended, ui, pages, tokens, cap_s)
            finally:
                ui.terminate()
                ui.wait(30)
        browser.close()
    two = results["coalesced_2_pages"]
    goals = [
        # The page keeps up: with two pages streaming at once on this machine, the last chunk shows within 1 s.
        goal("coalesced_two_pages_max_lag_s", two["max_lag_s"] if two["caught_up"] else cap_s, "<=", 1.0, "s"),
    ]
    return {
        "benchmark": "ui_bench",
        "quick": quick,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "cpu": cpu_info().to_dict(),
        "stream": {"tokens_per_answer": tokens, "chunks_per_s": CHUNKS_PER_S, "cap_s": cap_s},
        "results": results,
        "goals": goals,
    }


def print_table(out: dict) -> None:
    print(f"{'':22} {'caught up':>9} {'lag s':>14} {'page ms/chunk':>16} {'browser ms/chunk':>17} {'ui ms/chunk':>12}")
    for name, r in out["results"].items():
        lag = "/".join("-" if lag is None else f"{lag:.2f}" for lag in r["lag_s"])
        page = "/".join(f"{ms:.2f}" for ms in r["page_task_ms_per_chunk"])
        print(f"{name:22} {str(r['caught_up']):>9} {lag:>14} {page:>16} {r['browser_cpu_ms_per_chunk']:17.2f} {r['ui_cpu_ms_per_chunk']:12.2f}")
    print_goals(out["goals"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 1,500-token answer instead of 10,000 (about 2 minutes)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args()
    out = run(args.quick)
    print_table(out)
    text = json.dumps(out, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
