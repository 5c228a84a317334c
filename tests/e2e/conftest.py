"""Browser fixtures: the UI served against the session's live API server, and Debian's chromium under Playwright.

The UI runs in-process on its own loopback port (a second uvicorn in a thread) and reaches the API over
HTTP, as it would a remote deployment; no second engine starts. The browser is the system's
/usr/bin/chromium: Playwright never downloads one here. Each test leaves a full-page screenshot in
artifacts/e2e/.
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import REPO_ROOT
from tests.e2e.chat_page import loaded_in, patience_s
from tests.processes import CHROMIUM, CHROMIUM_ARGS, serve_in_thread

ARTIFACTS = REPO_ROOT / "artifacts" / "e2e"


@pytest.fixture(scope="session")
def ui_url(live_server):
    from fastapi import FastAPI

    from rstar.ui.app import UI_PATH, mount_ui

    base_url, stop = serve_in_thread(mount_ui(FastAPI(), live_server.base_url))
    yield f"{base_url}{UI_PATH}/"
    stop()


@pytest.fixture(scope="module")
def stand_in():
    """The UI on a stand-in API (tests/e2e/stand_in_api.py), one per test module: (the API, the UI's URL). Its
    answers are endless until a test sets `answer`."""
    from fastapi import FastAPI

    from rstar.ui.app import UI_PATH, mount_ui
    from tests.e2e.stand_in_api import StandInApi

    api = StandInApi()
    api_url, stop_api = serve_in_thread(api.app())
    base_url, stop_ui = serve_in_thread(mount_ui(FastAPI(), api_url))
    yield api, f"{base_url}{UI_PATH}/"
    stop_ui()
    stop_api()


@pytest.fixture(scope="module")
def browser():
    # Module scope, not session: Playwright's sync API keeps an event loop running on the main thread while
    # it is open, and every later test that calls asyncio.run() would then fail.
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), "the browser tests need Debian's chromium at /usr/bin/chromium: run `bash install.sh cpu,test` as root"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def new_page(browser, request):
    """Opens pages on a URL; each one's final state is screenshotted to artifacts/e2e/<test>[-n].png, and
    JavaScript errors on any of them fail the test. Every page is closed when the test ends, however it ends.

    A page's waits default to its patience (chat_page.patience_s): sized by how long this machine took to load
    it, since a CPU that loads the page slowly renders it slowly too."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    opened = []
    page_errors: list[str] = []

    def open_page(url: str):
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
        opened.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: page_errors.append(str(error)))
        started = time.monotonic()
        page.goto(url, timeout=120_000)
        page.wait_for_selector("#chat-input textarea", timeout=120_000)
        # The page's load events have run once the status line reads (connected, or what is wrong): a test
        # acts on the page as a person does, after it says it is there, not the moment its input shows.
        page.wait_for_function("document.querySelector('#server-status')?.innerText.trim().length > 0", timeout=120_000)
        loaded_in(page, time.monotonic() - started)
        page.set_default_timeout(patience_s(page) * 1000)
        return page

    yield open_page
    for number, context in enumerate(opened):
        suffix = f"-{number}" if number else ""
        try:
            # Bounded: a page still busy must not hold up the test's teardown (or the next test) for long.
            context.pages[0].screenshot(path=str(ARTIFACTS / f"{request.node.name}{suffix}.png"), full_page=True, timeout=15_000)
        except Exception as exc:  # the screenshot is evidence, not the test: say why it is missing
            print(f"no screenshot of page {number}: {exc}")
        finally:
            context.close()
    assert not page_errors, f"JavaScript errors on the page: {page_errors}"


@pytest.fixture
def page(new_page, ui_url):
    """The UI on the live server, loaded and connected."""
    page = new_page(ui_url)
    page.wait_for_function("document.querySelector('#server-status')?.innerText.includes('Connected to')", timeout=30_000)
    return page
